"""`make status`: Serve's view of a `make run` (what `serve status` prints), read through Ray, not its dashboard.

`make run` starts Ray without its dashboard (serve_app/run.py), so `serve status`, which asks the
dashboard's REST API, has nothing to ask. The launcher instead leaves a record of its Ray instance under
the port it serves (`record_path`, in a folder only its user may use; removed when it stops); this connects
to that instance as a driver and prints `serve.status()` as `serve status` prints it. A dashboard's view (a
cluster, `serve run`, or `make run` with SERVE_APP_RAY_DASHBOARD=1): `make status RAY_DASHBOARD_ADDRESS=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Optional

#: What a live launcher's command line holds (a recycled pid is not a record's launcher).
LAUNCHER_MODULE = "serve_app.run"
#: Ray's token authentication switch: `ray.init` sets it to "token" in the process that starts a local instance
#: (Ray 2.60), and a driver connecting to that instance needs it too, with the user's token (~/.ray/auth_token).
AUTH_MODE = "RAY_AUTH_MODE"
#: The longest `make status` waits for Ray: a connection to a dead GCS retries ~20 s, and `serve.status()`
#: waits on the Serve controller without a bound.
STATUS_TIMEOUT_S = 60.0


class RecordError(OSError):
    """The records' folder is not this user's alone: no record is read from it or written to it."""


def _uid() -> Optional[int]:
    return os.getuid() if hasattr(os, "getuid") else None


def own_folder(folder: Path, others: int = 0o022) -> bool:
    """Make `folder` (0700) if it is missing; whether it is a folder, not a link, of this user's with none of
    the mode bits `others` set (0o022: nobody else may write in it). A folder under a predictable name in a
    shared /tmp may have been made first by another local user."""
    uid = _uid()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    return stat.S_ISDIR(info.st_mode) and (uid is None or (info.st_uid == uid and not info.st_mode & others))


def records_dir() -> Path:
    """This user's folder of launcher records (created 0700). Another user could otherwise plant a record
    that sends `make status`, with this user's Ray token, to a Ray instance of theirs."""
    uid = _uid()
    folder = Path(tempfile.gettempdir()) / f"serve-app-{'user' if uid is None else uid}"
    if not own_folder(folder, others=0o077):
        raise RecordError(f"{folder} is not a folder of this user's alone (mode {oct(folder.lstat().st_mode & 0o777)})")
    return folder


def record_path(port: int) -> Path:
    """Where the launcher serving on `port` records its Ray instance."""
    return records_dir() / f"run-{int(port)}.json"


def write_record(port: int, gcs_address: str) -> Optional[Path]:
    """The launcher's record (atomic: a reader never sees half of it), after `ray.init`: with the token
    authentication mode Ray chose for its instance (a new local instance: token), never the token. None,
    writing nothing, if another live launcher holds the port's record (it serves there, not this one)."""
    if (held := read_record(port)) is not None and held.get("pid") != os.getpid():  # (ours: a dead predecessor's,
        return None                                                                # whose pid this launcher got)
    path = record_path(port)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump({"gcs_address": gcs_address, "pid": os.getpid(), "port": int(port),
                   "auth_mode": os.environ.get(AUTH_MODE, "disabled")}, f)
    os.replace(partial, path)
    return path


def remove_record(port: int, pid: Optional[int] = None) -> None:
    """Remove the record for `port` of launcher `pid` (default: this process); another launcher's, written
    since, stays. A launcher killed outright leaves its record: whoever killed it may remove it so."""
    try:
        path = record_path(port)
        if json.loads(path.read_text()).get("pid") == (os.getpid() if pid is None else pid):
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _is_launcher(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or another user's (PermissionError): not this user's launcher
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # no /proc (not Linux): alive is all that can be told
        return not Path("/proc/self").exists()
    return LAUNCHER_MODULE in command


def read_record(port: int) -> Optional[dict]:
    """The record of the launcher serving on `port`, or None if there is none or its launcher is gone (a
    launcher killed outright leaves its record: removed here)."""
    try:
        record = json.loads(record_path(port).read_text())
        pid, address = int(record["pid"]), str(record["gcs_address"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not _is_launcher(pid):
        remove_record(port, pid)
        return None
    return {**record, "gcs_address": address}


def _serve_status(record: dict) -> dict:
    """`serve.status()` of the recorded Ray instance, as a dict ready for `serve status`'s YAML dumper."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(AUTH_MODE, str(record.get("auth_mode") or "disabled"))
    import ray
    from ray import serve
    from ray.serve.scripts import process_dict_for_yaml_dump

    ray.init(address=record["gcs_address"], namespace="serve", logging_level="ERROR", log_to_driver=False)
    try:
        return process_dict_for_yaml_dump(asdict(serve.status()))
    finally:
        ray.shutdown()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 9527),
                        help="the port `make run` serves on (env PORT; default 9527)")
    ns = parser.parse_args(argv)
    record = read_record(ns.port)
    if record is None:
        print(f"serve-app: no `make run` of this user's is serving on port {ns.port}. For a Ray dashboard's view "
              "(a cluster, `serve run`, or `make run` with SERVE_APP_RAY_DASHBOARD=1): "
              "make status RAY_DASHBOARD_ADDRESS=http://<host>:8265", file=sys.stderr)
        return 1
    answer: dict = {}

    def ask() -> None:
        try:
            answer["status"] = _serve_status(record)
        except Exception as exc:  # noqa: BLE001 - said in one line below, not as Ray's traceback
            answer["error"] = exc

    asking = threading.Thread(target=ask, name="serve-status", daemon=True)
    asking.start()
    asking.join(STATUS_TIMEOUT_S)
    if "status" not in answer:
        why = answer.get("error") or f"no answer in {STATUS_TIMEOUT_S:g} s"
        print(f"serve-app: could not read Serve's status from the Ray instance at {record['gcs_address']} "
              f"(launcher pid {record['pid']}): {why}", file=sys.stderr)
        if asking.is_alive():  # a Ray call still waits in the thread: leave without waiting for it
            sys.stderr.flush()
            os._exit(1)
        return 1
    import yaml
    from ray.serve.scripts import ServeDeploySchemaDumper

    print(yaml.dump(answer["status"], Dumper=ServeDeploySchemaDumper, default_flow_style=False, sort_keys=False),
          end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
