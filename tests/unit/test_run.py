"""The `make run` launcher's environment (serve_app/run.py), without starting Ray."""

from __future__ import annotations

import json
import subprocess
import sys

from serve_app.run import LEAN_SERVE_TICKS, lean_serve_environment


def test_lean_ticks_are_added_where_the_environment_has_none():
    assert lean_serve_environment({}) == LEAN_SERVE_TICKS
    assert float(LEAN_SERVE_TICKS["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) > 0.1  # slower than Ray's default


def test_a_tick_the_user_set_is_left_as_it_is():
    added = lean_serve_environment({"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"})
    assert "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in added
    assert added["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] == LEAN_SERVE_TICKS["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"]


def test_the_installed_ray_serve_reads_every_lean_tick():
    """Ray ignores an environment variable it does not know: a misspelt or renamed one would make
    the launcher's setting a silent no-op. The pinned Ray must read each one into its constant."""
    probe = ("import json; from ray.serve._private import constants as c; "
             "print(json.dumps([c.CONTROL_LOOP_INTERVAL_S, c.RAY_SERVE_METRICS_EXPORT_INTERVAL_MS]))")
    env = {"PATH": "/usr/bin:/bin", **LEAN_SERVE_TICKS}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    control_loop_s, export_ms = json.loads(done.stdout.strip().splitlines()[-1])
    assert control_loop_s == float(LEAN_SERVE_TICKS["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"])
    assert export_ms == int(LEAN_SERVE_TICKS["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"])


class _Router:
    """Serve's router as the launcher sees it: each call goes to one replica, in the order given."""

    def __init__(self, picks: list[str]):
        self.picks = iter(picks)
        self.calls = 0

    def call_drain(self):
        self.calls += 1
        replica = next(self.picks)

        class Response:
            def result(self, timeout_s: float) -> dict:
                return {"replica": replica, "in_flight_at_start": 0, "in_flight_left": 0}
        return Response()


def test_drain_reaches_every_replica_even_when_the_router_repeats_one():
    from serve_app.run import drain_every_replica

    router = _Router(["a", "a", "a", "b"])  # round 1 reaches a twice; round 2 reaches a, then b
    drained = drain_every_replica(router.call_drain, replicas=2, timeout_s=1)
    assert set(drained) == {"a", "b"}
    assert router.calls == 4


def test_drain_gives_up_after_its_rounds_and_reports_whom_it_reached():
    from serve_app.run import drain_every_replica

    router = _Router(["a"] * 100)
    drained = drain_every_replica(router.call_drain, replicas=2, timeout_s=1, rounds=3)
    assert set(drained) == {"a"} and router.calls == 6


def test_one_replica_gets_one_call():
    from serve_app.run import drain_every_replica

    router = _Router(["a"])
    assert set(drain_every_replica(router.call_drain, replicas=1, timeout_s=1)) == {"a"}
    assert router.calls == 1
