"""Cluster tests: a real multi-node Ray cluster on this machine, built from
kuberay/rayservice-cpu.yaml (deploy/local_cluster), hurt while clients send requests.

`make cluster-test` runs them; CI runs those marked smoke (`make cluster-smoke`). They need root
(network namespaces) and iproute2; a run without them skips, except in CI (CI=true), where it fails. One cluster serves every test, module
after module, each in its file's order (each starts with `helpers.ready`: every pod up, every deployment at
full strength, whatever the test before left); every
namespace, link and process it made is removed at the end, also after a failure. Measured
figures are printed and saved in reports/cluster/figures.json (docs/deploy.md quotes them).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from deploy.local_cluster.cluster import LocalCluster
from deploy.local_cluster.netns import cleanup_stale, leftovers
from tests.support import save_figures

from .traffic import ServiceEndpoints

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "kuberay" / "rayservice-cpu.yaml"
FIGURES = ROOT / "reports" / "cluster" / "figures.json"


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: runs a multi-node Ray cluster of its own (make cluster-test)")
    # SIGTERM (a CI timeout, `kill`) ends the run like Ctrl-C, so the cluster fixture's teardown still
    # removes the namespaces and processes; a SIGKILLed run is cleaned up by the next one (cleanup_stale).
    signal.signal(signal.SIGTERM, _interrupt)


def pytest_collection_modifyitems(items):
    # pytest-timeout (pyproject: 600 s) bounds set-up too: the first test also starts the cluster.
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(1200))


#: Tests that failed or xfailed: the nodes' and Serve's logs are kept for them (an xfail marks an open
#: problem, and its logs are the evidence; pytest's testsfailed does not count it).
_FAILED: list[str] = []


def pytest_runtest_logreport(report):
    if "tests/cluster/" in report.nodeid and (report.failed or (report.skipped and hasattr(report, "wasxfail"))):
        _FAILED.append(report.nodeid)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("redis-server") is None:
        return "needs iproute2 and redis-server (scripts/install-system-deps)"
    return None


@pytest.fixture(scope="session")
def figures():
    """`figures[name] = value`: a measured outcome, printed and saved for the docs."""
    collected: dict = {}
    yield collected
    save_figures(FIGURES, collected, "cluster")


@pytest.fixture(scope="session")
def cluster(figures, request):
    why = _unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cluster tests cannot run in CI: {why}")
        pytest.skip(why)
    cleanup_stale()
    workdir = Path(tempfile.mkdtemp(prefix="sa-cluster-", dir="/tmp"))
    started = time.monotonic()
    with LocalCluster(MANIFEST, workdir) as local:
        figures["cluster_nodes_up_s"] = round(time.monotonic() - started, 1)
        local.submit_serve()
        figures["cluster_serve_running_after_submit_s"] = round(local.wait_running(300), 1)
        yield local
    # Stopped cleanly: none of its namespaces, links or processes is left (the "starts and stops cleanly").
    left = leftovers(local.network.cluster_id)
    left += [str(local.cpu.base)] if local.cpu.base is not None and local.cpu.base.exists() else []
    stray = [n.name for n in local.nodes if n.alive] + ([local.redis_proc.pid] if local.redis_proc else [])
    assert not left and not stray, f"the local cluster left namespaces, links or cgroups {left} and processes {stray}"
    if request.session.testsfailed or _FAILED:
        print(f"\ncluster tests failed or xfailed ({', '.join(_FAILED)}): the nodes' logs and Serve's logs "
              f"are kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def endpoints(cluster):
    """The `serve` Service: the workers' ready proxies, less a pod being deleted (Kubernetes takes a
    terminating pod out of its Services at once)."""
    service = ServiceEndpoints(lambda: [cluster.serve_url(w) for w in cluster.workers if not w.terminating]).start()
    yield service
    service.stop()
