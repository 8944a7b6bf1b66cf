"""The pinned Ray still has the private router state serve_app/_router_state.py reads (no Ray started).
(`taken`'s `_replica_result_future` is exercised with Serve's own DeploymentResponse in
tests/unit/test_reliability.py.)

HandleClient bounds a call's wait for a replica with it; if an upgrade renames it, these fail here
instead of calls waiting unbounded in Serve's router on a cluster."""

import inspect

from serve_app._router_state import replicas_known


def test_the_handles_router_keeps_its_running_replicas_where_they_are_read():
    from ray.serve._private.request_router.request_router import RequestRouter
    from ray.serve._private.router import AsyncioRouter, CurrentLoopRouter, SingletonThreadRouter
    from ray.serve.handle import DeploymentHandle

    assert "self._router" in inspect.getsource(DeploymentHandle.__init__)
    for router in (SingletonThreadRouter, CurrentLoopRouter):
        assert "self._asyncio_router = AsyncioRouter(" in inspect.getsource(router.__init__)
    assert "self._request_router" in inspect.getsource(AsyncioRouter.__init__)
    assert "self._running_replicas = running_replicas" in inspect.getsource(AsyncioRouter.update_deployment_targets)
    assert isinstance(RequestRouter.curr_replicas, property)


def test_replicas_known_reads_the_request_router_or_the_list_it_is_made_from():
    from types import SimpleNamespace as NS

    def handle(**router):
        return NS(_router=NS(_asyncio_router=NS(**router)))

    assert replicas_known(handle(_request_router=NS(curr_replicas={"a": 1, "b": 2}))) == 2
    assert replicas_known(handle(_request_router=None, _running_replicas=["a"])) == 1
    assert replicas_known(handle(_request_router=None, _running_replicas=None)) == 0
    assert replicas_known(NS(_router=None)) is None and replicas_known(object()) is None
