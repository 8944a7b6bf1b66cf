"""What the cluster tests read from Serve (through the head's dashboard, as `serve status` does)."""

from __future__ import annotations

import copy
import re
import time
from collections import Counter
from typing import Callable, Optional

import httpx

from deploy.local_cluster.cluster import LocalCluster
from tests.support import wait_for

APP = "serve-app"
#: A pod's node ALIVE, with the kubelet's restarts if its `ray start` fails (node.py START_RETRY_PAUSES_S).
NODE_START_BOUND_S = 300


def deployments(cluster: LocalCluster) -> dict:
    return cluster.serve_details()["applications"][APP]["deployments"]


def running_by_node(cluster: LocalCluster) -> dict[str, Counter]:
    """{deployment: Counter(node ip -> RUNNING replicas)}."""
    return {name: Counter(r["node_ip"] for r in d["replicas"] if r["state"] == "RUNNING")
            for name, d in deployments(cluster).items()}


def serving(cluster: LocalCluster, ready_urls: list[str]) -> Optional[tuple[dict, set[str]]]:
    """(replicas by node, the workers' URLs that hold one) once the ready endpoints are exactly those.

    Serve drains the proxy of a node that holds no replica (its /-/healthz answers 503), so the
    `serve` Service lists only the pods that hold one: that is what lets an autoscaler remove an
    idle pod. Which workers hold one depends on where the replicas landed."""
    by_node = running_by_node(cluster)
    holding = {cluster.serve_url(w) for w in cluster.workers if any(nodes[w.address] for nodes in by_node.values())}
    return (by_node, holding) if set(ready_urls) == holding else None


def replica_states(cluster: LocalCluster) -> dict[str, list[tuple[str, str]]]:
    """{deployment: [(state, node ip or "-" while not placed)]}, for a failure's message."""
    try:
        return {name: sorted((r["state"], r.get("node_ip") or "-") for r in d["replicas"])
                for name, d in deployments(cluster).items()}
    except Exception as exc:  # noqa: BLE001 - the message must still be written
        return {"unavailable": [(type(exc).__name__, str(exc))]}


def replica_ids(cluster: LocalCluster) -> dict[str, set[str]]:
    return {name: {r["replica_id"] for r in d["replicas"] if r["state"] == "RUNNING"}
            for name, d in deployments(cluster).items()}


def stopping(cluster: LocalCluster) -> dict[str, int]:
    """{deployment: replicas STOPPING}, for those with any."""
    counts = {name: sum(r["state"] == "STOPPING" for r in d["replicas"]) for name, d in deployments(cluster).items()}
    return {name: n for name, n in counts.items() if n}


def deployment_configs(cluster: LocalCluster) -> dict[str, dict]:
    """{deployment: the deployment_config Serve reports for it}."""
    return {name: d["deployment_config"] for name, d in deployments(cluster).items()}


def above_minimum(ids: dict[str, set[str]], configs: dict[str, dict]) -> dict[str, int]:
    """{deployment: RUNNING replicas} for those above their minimum (an earlier test's load scaled them up)."""
    return {name: len(running) for name, running in ids.items() if len(running) > minimum_replicas(configs[name])}


def downscale_begun(cluster: LocalCluster, above: dict[str, int]) -> dict[str, int]:
    """{deployment: replicas STOPPING} once the autoscaler has begun to stop some of `above` ({} when it is
    empty): tests hurt the cluster in the middle of a downscale, where a head restart once broke it."""
    if not above:
        return {}
    return wait_for(lambda: stopping(cluster), 240, f"a downscale of {above} to begin", 0.5)


def minimum_replicas(deployment_config: dict) -> int:
    """The fewest replicas a deployment runs, from the deployment_config Serve reports for it."""
    scaling = deployment_config.get("autoscaling_config") or {}
    return scaling.get("min_replicas", deployment_config.get("num_replicas", 1))


def at_full_strength(cluster: LocalCluster, avoid_ip: Optional[str] = None) -> bool:
    """Every deployment with at least its target of RUNNING replicas (not counting those on
    `avoid_ip`), none UNHEALTHY. The target moves with the load (the autoscaler), so a deployment
    still scaling down after an earlier test counts as at full strength once it has its target."""
    try:
        deps = deployments(cluster)
    except Exception:  # noqa: BLE001 - the controller is restarting or busy: not yet
        return False
    workers = len([w for w in cluster.workers if w.address != avoid_ip])
    for d in deps.values():
        running = [r for r in d["replicas"] if r["state"] == "RUNNING" and r["node_ip"] != avoid_ip]
        target = d["target_num_replicas"]
        per_node = (d.get("deployment_config") or {}).get("max_replicas_per_node") or _configured(
            cluster, d["name"], "max_replicas_per_node")
        if per_node:  # the Ingress: one per pod; a Kubernetes cluster would add a pod for more
            target = min(target, per_node * workers)
        if d["status"] in ("UNHEALTHY", "DEPLOY_FAILED") or len(running) < target:
            return False
    return True


def _configured(cluster: LocalCluster, deployment: str, key: str):
    app = next(a for a in cluster.spec.serve_config["applications"] if a["name"] == APP)
    return next((d.get(key) for d in app["deployments"] if d["name"] == deployment), None)


def running_counts(cluster: LocalCluster, avoid_ip: Optional[str] = None) -> Counter:
    """{deployment: RUNNING replicas}, not counting those on `avoid_ip`."""
    return Counter({name: sum(n for ip, n in nodes.items() if ip != avoid_ip)
                    for name, nodes in running_by_node(cluster).items()})


def worst_pod_to_lose(workers: list, by_node: dict[str, Counter]):
    """A pod that holds an Ingress; of those, the JobManager's if one is, then the one with the most
    deployments to replace (each starts its own kind of replica), then the most replicas."""
    return max((w for w in workers if by_node["Ingress"][w.address]),
               key=lambda w: (by_node["JobManager"][w.address],
                              sum(bool(nodes[w.address]) for nodes in by_node.values()),
                              sum(nodes[w.address] for nodes in by_node.values())))


def pod_to_lose(cluster: LocalCluster):
    """The worker `worst_pod_to_lose` picks now, and {deployment: its RUNNING replicas there}."""
    by_node = running_by_node(cluster)
    victim = worst_pod_to_lose(cluster.workers, by_node)
    return victim, {name: nodes[victim.address] for name, nodes in by_node.items() if nodes[victim.address]}


class Recovery:
    """A `wait_for` condition after a pod loss: the seconds since `lost_at` once every deployment has
    again as many RUNNING replicas as in `before`, none on `lost_ip` (one-per-pod deployments: as many
    as the surviving pods can hold). Replicas the autoscaler adds meanwhile are not asked for: they
    replace nothing that was lost. `back_after_s`: when each deployment got there."""

    def __init__(self, cluster: LocalCluster, before: Counter, lost_ip: str, lost_at: float):
        self.cluster, self.before, self.lost_ip, self.lost_at = cluster, before, lost_ip, lost_at
        self.back_after_s: dict[str, float] = {}

    def __call__(self) -> Optional[float]:
        try:
            now = running_counts(self.cluster, self.lost_ip)
        except Exception:  # noqa: BLE001 - the controller is busy: not yet
            return None
        survivors = len([w for w in self.cluster.workers if w.address != self.lost_ip])
        elapsed_s, short = time.monotonic() - self.lost_at, False
        for name, count in self.before.items():
            per_node = _configured(self.cluster, name, "max_replicas_per_node")
            if now[name] >= (min(count, per_node * survivors) if per_node else count):
                self.back_after_s.setdefault(name, round(elapsed_s, 1))
            else:
                short = True
        return None if short else elapsed_s


def ready(cluster: LocalCluster, timeout_s: float = 300) -> None:
    """Before a test: every pod up again (an earlier test may have failed with one down) and every
    deployment at full strength, so that one failure does not cascade into the next test."""
    restarted = cluster.restore()
    if restarted:
        print(f"restarted before the test: {restarted}")
    wait_full_strength(cluster, timeout_s)


def wait_full_strength(cluster: LocalCluster, timeout_s: float, avoid_ip: Optional[str] = None) -> float:
    start = time.monotonic()
    wait_for(lambda: at_full_strength(cluster, avoid_ip), timeout_s, "every deployment at full strength", 0.5)
    return time.monotonic() - start


def worker_ips(cluster: LocalCluster) -> list[str]:
    return [w.address for w in cluster.workers]


# -- a job across the changes (the RayServices keep jobs in Redis: SERVE_APP_JOBS_STORE=redis) -------

def job_payload(records: int, tag: str) -> dict:
    return {"fromLang": "en", "toLang": "pt",
            "records": [{"id": f"{tag}-{i}", "text": f"Record {i} of the {tag} catalogue ships today."}
                        for i in range(records)]}


def submit_job(urls: list[str], api_key: str, payload: dict, key: str) -> str:
    """POST /jobs through the first pod that answers 202; the job's id."""
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key}
    for url in urls:
        try:
            r = httpx.post(f"{url}/jobs", json={"task": "translation", "payload": payload}, headers=headers, timeout=30)
        except httpx.HTTPError:
            continue
        if r.status_code == 202:
            return r.json()["job_id"]
    raise AssertionError(f"no pod accepted the job: {urls}")


def finished_job(urls: Callable[[], list[str]], api_key: str, job_id: str, timeout_s: float) -> dict:
    """GET /jobs/<id> through any ready pod until the job has finished; its view. A 503 or a broken
    connection (the JobManager being replaced, a pod lost) is "not yet"."""
    headers = {"Authorization": f"Bearer {api_key}"}

    def done() -> Optional[dict]:
        for url in urls():
            try:
                r = httpx.get(f"{url}/jobs/{job_id}", headers=headers, timeout=10)
            except httpx.HTTPError:
                continue
            if r.status_code == 200 and r.json()["status"] in ("succeeded", "failed", "cancelled"):
                return r.json()
            assert r.status_code in (200, 503), f"GET /jobs/{job_id}: {r.status_code} {r.text[:300]}"
        return None

    return wait_for(done, timeout_s, f"job {job_id} to finish", 1.0)


_FOUND_LIVE = re.compile(r"Recovering current state for Deployment\(name='([^']+)'.* from (\d+) live actors")
_STOPPED_RECOVERING = re.compile(
    r"Stopping Replica\(id='[^']+', deployment='([^']+)'.*\(currently ReplicaState\.RECOVERING\)")


def controller_recovery(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """What the restarted head's Serve controller did as it recovered, from its log: per deployment, the
    replicas it found live and those it stopped before they were RUNNING again (a downscale redone)."""
    logs = [p for p in (cluster.workdir / "ray").glob("session_*/logs/serve/controller_*.log")
            if re.fullmatch(r"controller_\d+\.log", p.name)]
    if not logs:
        return {}
    text = max(logs, key=lambda p: p.stat().st_mtime).read_text(errors="replace")
    found = {name: {"found_live": int(n), "stopped_on_recovery": 0} for name, n in _FOUND_LIVE.findall(text)}
    for name in _STOPPED_RECOVERING.findall(text):
        found.setdefault(name, {"found_live": 0, "stopped_on_recovery": 0})["stopped_on_recovery"] += 1
    return found


# -- in-place updates (a serveConfigV2 changed) ------------------------------------------------------

def updated_config(config: dict, change) -> dict:
    new = copy.deepcopy(config)
    change(new["applications"][0])
    return new


def deployment_of(app: dict, name: str) -> dict:
    return next(d for d in app["deployments"] if d["name"] == name)


def translator_batch_size(cluster):
    try:
        return deployments(cluster)["Translator"]["deployment_config"]["user_config"]["max_batch_size"]
    except Exception:  # noqa: BLE001 - mid-update: not yet
        return None
