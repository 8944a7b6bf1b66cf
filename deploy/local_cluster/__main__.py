"""`make cluster`: the CPU RayService on a local multi-node Ray cluster, until Ctrl-C.

    python -m deploy.local_cluster [--manifest kuberay/rayservice-cpu.yaml] [--workers N]

Starts a Ray head and the worker group's pods as Ray nodes, each in a network namespace of its own
(198.18.x.0/24 addresses, a bridge on this machine), submits serveConfigV2 as the KubeRay operator
does, waits until the application is RUNNING, prints each worker's Serve URL and the API key, and
on Ctrl-C / SIGTERM removes every process, namespace and link it made. Needs root and iproute2
(scripts/install-system-deps). `python -m deploy.local_cluster --cleanup` removes what a killed
run left behind.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from .cluster import ROOT, LocalCluster
from .netns import cleanup_stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=ROOT / "kuberay" / "rayservice-cpu.yaml")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker pods to start (default: the worker group's replicas)")
    parser.add_argument("--cleanup", action="store_true", help="remove what killed runs left behind, then exit")
    ns = parser.parse_args(argv)
    removed = cleanup_stale()
    if ns.cleanup:
        print(f"removed {len(removed)} stale namespaces/links" + (f": {', '.join(removed)}" if removed else ""))
        return 0
    stop, serving, removing = threading.Event(), threading.Event(), threading.Event()

    def on_signal(signum, frame) -> None:
        if removing.is_set():  # a second Ctrl-C cut the removal short, leaving namespaces, Redis and HAProxy behind
            print("removing what the cluster made; a moment", file=sys.stderr, flush=True)
        elif not serving.is_set():  # still starting (minutes at worst): stop now, removing what was made
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    workdir = Path(tempfile.mkdtemp(prefix="sa-cluster-", dir="/tmp"))
    try:
        return _serve(ns, workdir, stop, serving, removing)
    except KeyboardInterrupt:
        print("stopped while starting; every namespace and process it made is removed", file=sys.stderr)
        return 130


def _serve(ns: argparse.Namespace, workdir: Path, stop: threading.Event, serving: threading.Event,
           removing: threading.Event) -> int:
    cluster = LocalCluster(ns.manifest, workdir, workers=ns.workers)
    remove = cluster.stop
    cluster.stop = lambda: (removing.set(), remove())[-1]  # (runs on any exit of `with`; signals then wait for it)
    with cluster:
        cluster.submit_serve()
        print(f"Serve application RUNNING {cluster.wait_running(600):.0f} s after submission")
        print("Serve proxies (the `serve` Service's endpoints):")
        for worker in cluster.workers:
            print(f"  {cluster.serve_url(worker)}")
        print(f"Ray dashboard: {cluster.dashboard_url} (Authorization: Bearer {cluster.ray_token})")
        print(f"API key: {cluster.api_key}")
        print(f"  curl -s {cluster.serve_url(cluster.workers[0])}/translation -H 'authorization: Bearer "
              f"{cluster.api_key}' -H 'content-type: application/json' -d '{{\"payload\": {{\"fromLang\": \"en\", "
              f"\"toLang\": \"pt\", \"records\": [{{\"id\": \"1\", \"text\": \"Hello\"}}]}}}}'")
        print("Ctrl-C stops it and removes every namespace and process it made.", flush=True)
        serving.set()
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
