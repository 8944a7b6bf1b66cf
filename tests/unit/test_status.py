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
    assert path.parent.parent == records and path.name == "run-9527.json"
    assert path.parent.stat().st_mode & 0o777 == 0o700  # this user's alone
    assert status.read_record(9527) == {"gcs_address": "127.0.0.1:6379", "pid": os.getpid(), "port": 9527,
                                        "auth_mode": "token"}
    assert status.read_record(8000) is None  # another port: another launcher, none here
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
    # A second launcher on the same port (it will fail to bind) leaves the first one's record alone.
    # a live launcher, to the test: the marker in its own arguments (sys.executable need not spell the path the
    # way this process's first word does: a CI run took it for no launcher and replaced the record)
    other = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(30)",
                              status.LAUNCHER_MODULE], stdout=subprocess.PIPE)
    try:  # Popen returns once the child has exec'd, which can be before the kernel has set its /proc cmdline (here
        other.stdout.readline()  # it read empty, under load): the child's first output comes after that
        path.write_text(json.dumps({**json.loads(path.read_text()), "pid": other.pid}))
        assert status.write_record(9527, "127.0.0.1:7000") is None
        assert status.read_record(9527)["gcs_address"] == "127.0.0.1:6379"
    finally:
        other.kill()
        other.wait()
        other.stdout.close()


def test_a_record_left_under_this_launcher_s_own_pid_is_replaced(records):
    """A launcher killed outright (OOM) and started again with the same pid (a container's) kept its predecessor's
    record, said another run held the port, and `make status` asked the dead Ray instance."""
    status.write_record(9527, "10.0.0.1:41111")
    assert status.write_record(9527, "127.0.0.1:6379") is not None
    assert status.read_record(9527)["gcs_address"] == "127.0.0.1:6379"


def test_a_records_folder_others_may_write_to_is_refused(records):
    """Another user could plant a record there that leads `make status`, with this user's Ray token, to a Ray
    instance of theirs: no record is read from or written to a folder that is not this user's alone."""
    status.write_record(9527, "127.0.0.1:6379")
    status.records_dir().chmod(0o777)
    assert status.read_record(9527) is None
    with pytest.raises(status.RecordError):
        status.write_record(9527, "127.0.0.1:6379")


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


def test_make_status_asks_the_recorded_ray_with_its_auth_mode_and_prints_serve_status_yaml(records, monkeypatch,
                                                                                          capsys):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    status.write_record(9527, "127.0.0.1:6379")
    monkeypatch.delenv("RAY_AUTH_MODE")  # `make status`'s own environment: the record names the mode
    asked = []

    def serve_status(record):
        asked.append((record["gcs_address"], record["auth_mode"]))
        return {"applications": {"serve-app": {"status": "RUNNING"}}}

    monkeypatch.setattr(status, "_serve_status", serve_status)
    assert status.main(["--port", "9527"]) == 0
    assert asked == [("127.0.0.1:6379", "token")]
    assert "serve-app:\n    status: RUNNING" in capsys.readouterr().out


def test_make_status_says_in_one_line_why_ray_did_not_answer(records, monkeypatch, capsys):
    import ray

    status.write_record(9527, "127.0.0.1:6379")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # restored after the test: _serve_status sets it otherwise

    def refused(*args, **kwargs):
        raise ConnectionError("GCS refused")

    monkeypatch.setattr(ray, "init", refused)
    assert status.main(["--port", "9527"]) == 1
    err = capsys.readouterr().err
    assert "could not read Serve's status from the Ray instance at 127.0.0.1:6379" in err and "GCS refused" in err


def test_without_a_launcher_make_status_says_where_to_look_and_starts_no_ray(records, monkeypatch, capsys):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started with no launcher to ask")

    monkeypatch.setattr(ray, "init", no_ray)
    assert status.main(["--port", "9527"]) == 1
    err = capsys.readouterr().err
    assert "no `make run` of this user's is serving on port 9527" in err and "RAY_DASHBOARD_ADDRESS" in err
