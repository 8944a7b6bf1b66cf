"""`make status` without Ray's dashboard (serve_app/status.py): the launcher's record of its Ray instance.
No Ray here: the record's life and what `make status` says when there is no launcher to ask; the real
connection is tested against the integration tier's `make run` (tests/integration/test_observability.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve_app import status


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Records in a folder of this test's, and this process taken for a launcher (its command line's
    first word), so that a record of its own pid is a live launcher's."""
    monkeypatch.setattr(status.tempfile, "gettempdir", lambda: str(tmp_path))
    own = Path("/proc/self/cmdline")
    if own.exists():
        monkeypatch.setattr(status, "LAUNCHER_MODULE", own.read_bytes().split(b"\0")[0].decode())
    return tmp_path


def test_a_live_launchers_record_is_read_back_under_its_port(records, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # what ray.init set in the launcher: the mode, never the token
    path = status.write_record(9527, "127.0.0.1:6379")
    assert path.parent == records and path.name == "serve-app-run-9527.json"
    assert status.read_record(9527) == {"gcs_address": "127.0.0.1:6379", "pid": os.getpid(), "port": 9527,
                                        "auth_mode": "token"}
    assert status.read_record(8000) is None  # another port: another launcher, none here
    assert [p.name for p in records.iterdir()] == [path.name]  # no partial file left


def test_a_record_whose_launcher_is_gone_is_no_launcher(records):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    status.write_record(9527, "127.0.0.1:6379")
    path = status.record_path(9527)
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": int(gone.stdout)}))
    assert status.read_record(9527) is None
    assert not path.exists()  # a killed launcher's record is removed once found stale


def test_a_recycled_pid_is_not_a_launcher(tmp_path, monkeypatch):
    """The pid lives, but as another program (pids wrap): its command line names no serve_app.run."""
    monkeypatch.setattr(status.tempfile, "gettempdir", lambda: str(tmp_path))
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("no /proc: a live pid is all that can be told")
    status.write_record(9527, "127.0.0.1:6379")  # this pytest process: alive, not a launcher
    assert status.read_record(9527) is None


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"pid": 1}', '{"gcs_address": "x", "pid": "one"}'])
def test_a_broken_record_is_no_launcher(records, text):
    status.record_path(9527).write_text(text)
    assert status.read_record(9527) is None


def test_a_launcher_removes_its_own_record_only(records):
    status.write_record(9527, "127.0.0.1:6379")
    status.remove_record(9527)
    assert not status.record_path(9527).exists()
    # A second launcher on the port wrote its record since: the first one's stop leaves it.
    status.record_path(9527).write_text(json.dumps({"gcs_address": "127.0.0.1:1", "pid": os.getpid() + 1}))
    status.remove_record(9527)
    assert status.record_path(9527).exists()
    status.remove_record(8000)  # none: nothing to do, no error
    status.remove_record(9527, os.getpid() + 1)  # who killed that launcher removes its record
    assert not status.record_path(9527).exists()


def test_without_a_launcher_make_status_says_where_to_look_and_starts_no_ray(records, monkeypatch, capsys):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started with no launcher to ask")

    monkeypatch.setattr(ray, "init", no_ray)
    assert status.main(["--port", "9527"]) == 1
    err = capsys.readouterr().err
    assert "no `make run` is serving on port 9527" in err and "RAY_DASHBOARD_ADDRESS" in err
