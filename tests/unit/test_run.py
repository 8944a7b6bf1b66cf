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
