"""The `make run` launcher's environment (serve_app/run.py), without starting Ray."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from serve_app.run import LEAN_SERVE_TICKS, ONE_NODE_SERVE_ENVIRONMENT, lean_serve_environment


def test_lean_ticks_are_added_where_the_environment_has_none():
    assert lean_serve_environment({}) == {**LEAN_SERVE_TICKS, **ONE_NODE_SERVE_ENVIRONMENT}
    assert float(LEAN_SERVE_TICKS["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) > 0.1  # slower than Ray's default


def test_a_tick_the_user_set_is_left_as_it_is():
    added = lean_serve_environment({"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"})
    assert "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in added
    assert added["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == LEAN_SERVE_TICKS["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"]


def test_the_installed_ray_serve_reads_every_lean_tick():
    """Ray ignores an environment variable it does not know: a misspelt or renamed one would make
    the launcher's setting a silent no-op. The pinned Ray must read each one into its constant."""
    probe = ("import json; from ray.serve._private import constants as c; "
             "print(json.dumps([c.CONTROL_LOOP_INTERVAL_S, c.RAY_SERVE_METRICS_EXPORT_INTERVAL_MS, "
             "c.RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD]))")
    env = {"PATH": "/usr/bin:/bin", **lean_serve_environment({})}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    control_loop_s, export_ms, user_code_in_a_thread = json.loads(done.stdout.strip().splitlines()[-1])
    assert control_loop_s == float(LEAN_SERVE_TICKS["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"])
    assert export_ms == int(LEAN_SERVE_TICKS["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"])
    assert user_code_in_a_thread is False


def test_the_stop_reaches_a_replica_that_waits_and_one_that_starts_after_it():
    """serve_app/drain_signal.py's actor, as a plain object: replicas waiting on the stop all wake up,
    one that asks after the stop is answered at once, and the launcher gets every report."""
    from serve_app.drain_signal import Signal

    async def scenario():
        signal = Signal()
        waiting = [asyncio.ensure_future(signal.wait_for_stop()) for _ in range(2)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiting)
        await signal.stop(7.5)
        assert await asyncio.gather(*waiting) == [7.5, 7.5]
        assert await signal.wait_for_stop() == 7.5  # a replica started after the stop
        reports = asyncio.ensure_future(signal.reports(3, timeout_s=5))
        for replica in "abc":
            await signal.report(replica, {"in_flight_left": 0})
        assert set(await reports) == {"a", "b", "c"}

    asyncio.run(scenario())


def test_the_launcher_gives_up_on_a_replica_that_never_reports():
    from serve_app.drain_signal import Signal

    async def scenario():
        signal = Signal()
        await signal.report("a", {})
        return await signal.reports(2, timeout_s=0.05)

    assert set(asyncio.run(scenario())) == {"a"}


def test_the_launcher_starts_its_own_ray_unless_told_to_join_one(monkeypatch):
    """Issue 30: `ray.init()` with no address joins whatever cluster the machine's last `ray start`
    recorded; the launcher names one: its own (local), or the one the user gave."""
    import serve_app.run as run

    seen = {}

    def parse_only(ns):
        seen["address"] = ns.address
        return 0

    monkeypatch.setattr(os, "environ", os.environ.copy())  # main() sets Ray's variables in it
    monkeypatch.setattr(run, "_serve", parse_only)
    monkeypatch.setattr(run, "proxy_environment", lambda choice, run_dir, *a, **kw: ("python", {}))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert run.main(["serve_config.yaml"]) == 0 and seen["address"] == "local"
    monkeypatch.setenv("RAY_ADDRESS", "198.18.0.1:6379")
    assert run.main(["serve_config.yaml"]) == 0 and seen["address"] == "198.18.0.1:6379"
    assert run.main(["serve_config.yaml", "--address", "local"]) == 0 and seen["address"] == "local"


def test_the_launcher_gives_the_proxy_the_ingress_replicas_bound_from_its_config(monkeypatch):
    """serve_app/proxy_shedding.py: what HAProxy may send each Ingress replica comes from the config served
    (64 admitted + 192 waiting in serve_config.placed.yaml); proxy_environment sets it (test_proxy.py)."""
    import serve_app.run as run

    seen = {}

    def proxy_environment(choice, run_dir, *a, shedding=None):
        seen["shedding"] = shedding.app("serve-app")
        return "haproxy", {}

    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.setattr(run, "_serve", lambda ns: 0)
    monkeypatch.setattr(run, "proxy_environment", proxy_environment)
    assert run.main(["serve_config.placed.yaml"]) == 0
    assert (seen["shedding"].max_requests_per_replica, seen["shedding"].max_queue_wait_s) == (256, 2.0)


def _fake_actor(sent: list, reports: dict):
    from types import SimpleNamespace

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args):
            sent.append((self.name, args))
            if self.name == "watched":  # (a replica named "loading" is still in its constructor)
                return set(args[0]) - {"loading"}
            return reports if self.name == "reports" else None

    return SimpleNamespace(stop=Method("stop"), reports=Method("reports"), watched=Method("watched"))


def test_the_launcher_waits_for_the_ingress_replicas_alive_at_the_stop_by_id(monkeypatch, capsys):
    """Serve names each replica's actor by its id: the launcher waits for those of its applications'
    Ingress deployments (a replica starting during the stop reports at once and must not stand in for a
    busy one), and another application's deployments are none of its business."""
    import ray

    from serve_app import drain_signal

    names = ["SERVE_REPLICA::serve-app#Ingress#a1", "SERVE_REPLICA::serve-app#Ingress#b2",
             "SERVE_REPLICA::serve-app#Ingress#loading",
             "SERVE_REPLICA::serve-app#Translator#c3", "SERVE_REPLICA::other#Ingress#d4", "SERVE_CONTROLLER_ACTOR"]
    monkeypatch.setattr(ray.util, "list_named_actors",
                        lambda all_namespaces=False: [{"name": n, "namespace": "serve"} for n in names])
    monkeypatch.setattr(ray, "get", lambda value: value)
    sent: list = []
    drain_signal.drain(_fake_actor(sent, {"a1": {}, "b2": {}, "new": {}}), ["serve-app"], 5.0)
    assert sent[:2] == [("stop", (5.0,)), ("reports", ({"a1", "b2", "loading"}, 15.0))]
    # one still in its constructor at the stop is neither waited for nor counted
    assert "drained 2 of 2 Ingress replica(s)" in capsys.readouterr().out


def test_without_replica_names_the_stop_counts_running_replicas_and_skips_an_app_without_ingress(monkeypatch):
    from types import SimpleNamespace

    import ray
    from ray import serve

    from serve_app import drain_signal

    def unreadable(all_namespaces=False):
        raise RuntimeError("no names")

    ingress = SimpleNamespace(replica_states={"RUNNING": 2})
    apps = {"serve-app": SimpleNamespace(deployments={"Ingress": ingress}),
            "other": SimpleNamespace(deployments={"Model": SimpleNamespace(replica_states={"RUNNING": 1})})}
    monkeypatch.setattr(ray.util, "list_named_actors", unreadable)
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications=apps))
    monkeypatch.setattr(ray, "get", lambda value: value)
    sent: list = []
    drain_signal.drain(_fake_actor(sent, {"a": {}, "b": {}}), ["serve-app", "other"], 5.0)
    assert sent == [("stop", (5.0,)), ("reports", (2, 15.0))]


def test_the_signal_waits_for_the_replicas_it_was_given_not_for_any_as_many():
    """... nor for one still in its constructor at the stop ("loading": it took no request; the stop waited the whole
    drain timeout + 10 s for an Ingress the autoscaler had just added)."""
    from serve_app.drain_signal import Signal

    async def scenario():
        signal = Signal()
        for replica in ("busy", "idle"):
            await signal.watching(replica)
        await signal.stop(1.0)
        await signal.watching("late")  # (watching after the stop began: not waited for either)
        reports = asyncio.ensure_future(signal.reports({"busy", "idle", "loading", "late"}, timeout_s=5))
        await signal.report("idle", {})
        await signal.report("new", {})  # started during the stop
        await asyncio.sleep(0.05)
        assert not reports.done()  # two reports in, but not the busy replica's
        await signal.report("busy", {"in_flight_left": 0})
        return await reports

    assert set(asyncio.run(scenario())) == {"busy", "idle", "new"}


def test_the_application_names_are_read_once_and_a_broken_config_reads_as_none(tmp_path):
    import serve_app.run as run

    config = tmp_path / "c.yaml"
    config.write_text("applications:\n  - name: serve-app\n")
    assert run._app_names(str(config)) == ["serve-app"]
    config.write_text("applications: [\n")  # half-edited while serving
    assert run._app_names(str(config)) == []
    assert run._app_names(str(tmp_path / "gone.yaml")) == []



def test_a_config_with_problems_is_refused_before_ray_starts(monkeypatch, tmp_path, capsys):
    """The launcher checks the config itself (serve_app.config_check; `make run` no longer runs the check
    as a process of its own): a misspelt key exits 1 quoting it, and no Ray is started."""
    import argparse
    from pathlib import Path

    import ray

    import serve_app.run as run

    shipped = (Path(__file__).resolve().parents[2] / "serve_config.placed.yaml").read_text()
    config = tmp_path / "c.yaml"
    config.write_text(shipped.replace("max_batch_size", "max_batch_sise", 1))

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started for a config with problems")

    monkeypatch.setattr(ray, "init", no_ray)
    ns = argparse.Namespace(config=str(config), address="local", dashboard=False, drain_timeout_s=1.0)
    assert run._serve(ns) == 1
    assert "max_batch_sise" in capsys.readouterr().err


def test_the_launcher_deploys_the_config_as_serve_run_does(monkeypatch):
    """`_deploy` starts Serve with the config's own proxy location and HTTP options, then submits its
    applications without waiting (ray/serve/scripts.py's `run`, which the launcher no longer spawns)."""
    import inspect
    from pathlib import Path

    import yaml
    from ray.serve._private import api as serve_api
    from ray.serve.config import gRPCOptions
    from ray.serve.schema import ServeDeploySchema

    import serve_app.run as run

    seen = {}

    class Client:
        def deploy_apps(self, schema, _blocking=True):
            seen["schema"], seen["blocking"] = schema, _blocking

    def serve_start(**options):
        seen["options"] = options
        return Client()

    # The real serve_start takes **kwargs too, so a misspelt option would pass silently: its names must
    # be the ones `serve run` passes, each a parameter of the real function.
    named = set(inspect.signature(serve_api.serve_start).parameters) - {"kwargs"}
    monkeypatch.setattr(serve_api, "serve_start", serve_start)
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "serve_config.placed.yaml").read_text())
    run._deploy(config)
    options = seen["options"]
    assert set(options) == {"http_options", "proxy_location", "grpc_options", "controller_options"} <= named
    assert options["http_options"]["port"] == 9527 and options["http_options"]["host"] == "127.0.0.1"
    assert str(options["proxy_location"].value) == config["proxy_location"]
    assert isinstance(options["grpc_options"], gRPCOptions)
    assert isinstance(seen["schema"], ServeDeploySchema) and seen["blocking"] is False
    assert [app.name for app in seen["schema"].applications] == ["serve-app"]


def test_a_failed_deploy_shuts_serve_down_and_exits_1(monkeypatch, capsys):
    """Serve's start or the submission failing: what did start is shut down (on a joined cluster Serve's
    detached actors would otherwise stay) and the launcher exits 1, saying why. Ray itself is faked."""
    import argparse
    import signal
    from pathlib import Path

    import ray
    from ray import serve

    import serve_app.run as run
    from serve_app import drain_signal, status

    calls = []
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append("ray.init"))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("ray.shutdown"))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: argparse.Namespace(gcs_address="127.0.0.1:6379"))
    monkeypatch.setattr(serve, "shutdown", lambda: calls.append("serve.shutdown"))
    monkeypatch.setattr(drain_signal, "create", lambda: calls.append("drain_signal"))
    monkeypatch.setattr(status, "write_record",
                        lambda port, address: calls.append(f"record {port} {address}") or Path("record.json"))
    monkeypatch.setattr(status, "remove_record", lambda port: calls.append(f"record {port} removed"))
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the test process keeps its own handlers

    def refused(config):
        raise RuntimeError("controller refused")

    monkeypatch.setattr(run, "_deploy", refused)
    monkeypatch.setattr(run, "port_taken", lambda host, port: "")  # 9527 may serve a developer's `make run`
    config = Path(__file__).resolve().parents[2] / "serve_config.placed.yaml"
    ns = argparse.Namespace(config=str(config), address="local", dashboard=False, drain_timeout_s=1.0)
    assert run._serve(ns) == 1
    # `make status`'s record of this Ray instance (serve_app/status.py) is removed even so
    assert calls == ["ray.init", "drain_signal", "record 9527 127.0.0.1:6379", "serve.shutdown", "record 9527 removed",
                     "ray.shutdown"]
    out = capsys.readouterr().out
    assert "could not deploy" in out and "controller refused" in out
