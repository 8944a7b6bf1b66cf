"""`make status`: Serve's view of a `make run` (what `serve status` prints), read through Ray, not its dashboard.

`make run` starts Ray without its dashboard (serve_app/run.py), so `serve status`, which asks the
dashboard's REST API, has nothing to ask. The launcher instead leaves a record of its Ray instance under
the port it serves (`record_path`, removed when it stops); this connects to that instance as a driver and
prints `serve.status()` as `serve status` prints it. A dashboard's view (a cluster, `serve run`, or
`make run` with SERVE_APP_RAY_DASHBOARD=1): `make status RAY_DASHBOARD_ADDRESS=http://<host>:8265`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Optional

#: What a live launcher's command line holds (a recycled pid is not a record's launcher).
LAUNCHER_MODULE = "serve_app.run"
#: Ray's token authentication switch: `ray.init` sets it to "token" in the process that starts a local instance
#: (Ray 2.60), and a driver connecting to that instance needs it too, with the user's token (~/.ray/auth_token).
AUTH_MODE = "RAY_AUTH_MODE"


def record_path(port: int) -> Path:
    """Where the launcher serving on `port` records its Ray instance."""
    return Path(tempfile.gettempdir()) / f"serve-app-run-{int(port)}.json"


def write_record(port: int, gcs_address: str) -> Path:
    """The launcher's record (atomic: a reader never sees half of it), after `ray.init`: with the token
    authentication mode Ray chose for its instance (a new local instance: token), never the token."""
    path = record_path(port)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"gcs_address": gcs_address, "pid": os.getpid(), "port": int(port),
                                   "auth_mode": os.environ.get(AUTH_MODE, "disabled")}))
    os.replace(partial, path)
    return path


def remove_record(port: int, pid: Optional[int] = None) -> None:
    """Remove the record for `port` of launcher `pid` (default: this process); another launcher's, written
    since, stays. A launcher killed outright leaves its record: whoever killed it may remove it so."""
    path = record_path(port)
    try:
        if json.loads(path.read_text()).get("pid") == (os.getpid() if pid is None else pid):
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _is_launcher(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    try:
        return LAUNCHER_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # no /proc (not Linux): alive is all that can be told
        return not Path("/proc/self").exists()


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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 9527),
                        help="the port `make run` serves on (env PORT; default 9527)")
    ns = parser.parse_args(argv)
    record = read_record(ns.port)
    if record is None:
        print(f"serve-app: no `make run` is serving on port {ns.port} ({record_path(ns.port)} names no live "
              "launcher). For a Ray dashboard's view (a cluster, `serve run`, or `make run` with "
              "SERVE_APP_RAY_DASHBOARD=1): make status RAY_DASHBOARD_ADDRESS=http://<host>:8265", file=sys.stderr)
        return 1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(AUTH_MODE, str(record.get("auth_mode") or "disabled"))
    import ray
    import yaml
    from ray import serve
    from ray.serve.scripts import ServeDeploySchemaDumper, process_dict_for_yaml_dump

    ray.init(address=record["gcs_address"], namespace="serve", logging_level="ERROR", log_to_driver=False)
    try:
        status = process_dict_for_yaml_dump(asdict(serve.status()))
    finally:
        ray.shutdown()
    print(yaml.dump(status, Dumper=ServeDeploySchemaDumper, default_flow_style=False, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
