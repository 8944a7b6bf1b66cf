"""What HandleClient reads of Ray Serve's router, in one place: both readings are private in Ray.

- `taken(response)`: done once a replica has accepted a call. Serve resolves a DeploymentResponse's
  `_replica_result_future` then (a replica that is full or shutting down rejects the call, and the
  router tries another).
- `replicas_known(handle)`: how many running replicas the handle's router may send a call to now,
  as the controller last told it (`RequestRouter.curr_replicas`). It is 0 while a deployment has
  no running replica, e.g. after a recovering controller stopped them all (tests/cluster).

tests/unit/test_router_state.py and test_reliability.py check that the pinned Ray still has both, so an upgrade that
renames them fails there, not as calls that wait unbounded on a cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Optional


def taken(response: Any) -> Optional[asyncio.Future]:
    """A future done once a replica has accepted the call, or None where the response has none (fakes)."""
    future = getattr(response, "_replica_result_future", None)
    if future is None:
        return None
    if isinstance(future, concurrent.futures.Future):
        future = asyncio.wrap_future(future)
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return future


def replicas_known(handle: Any) -> Optional[int]:
    """Running replicas the handle's router knows of, or None where that cannot be read (a fake
    handle, a handle that has sent nothing yet, a Ray whose router is built differently)."""
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    if router is None:
        return None
    request_router = getattr(router, "_request_router", None)
    if request_router is not None:
        return len(request_router.curr_replicas)
    # The request router is made on first use; until then the router keeps the controller's list.
    return len(getattr(router, "_running_replicas", None) or ())
