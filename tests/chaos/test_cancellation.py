"""Faults 5 and 6: a request past its deadline (X-Request-Timeout-Ms) gets 504 promptly, and a
client that disconnects is let go (on Serve's Python proxy; measured through HAProxy); in both
cases the records not yet computing are not computed: those in the Translator's @serve.batch queue
are dropped there, and the ingress sends no more.

Proof from the replicas' own counters on Ray's Prometheus endpoint:
serve_app_records_enqueued_total = serve_app_records_total (computed) + serve_app_records_cancelled_total
(dropped before their batch started); past the deadline, most of the enqueued records are cancelled.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from .harness import ServeRun, metric_sum, wait_for
from .helpers import is_clean_error, post, start_while_computing, translation_body

REQUESTS = 12
RECORDS = 64          # 8 calls of 8 records each; 4 in flight per request -> 384 records queued
DEADLINE_MS = 400


def _counters(run) -> tuple[float, float, float]:
    s = run.scrape()
    return tuple(metric_sum(s, name, deployment="Translator") for name in (
        "serve_app_records_enqueued_total", "serve_app_records_total", "serve_app_records_cancelled_total"))


#: Replicas hand their metrics to Ray's agent every second here (harness: metrics_report_interval_ms);
#: on two starved cores a report can come late, so a count is trusted once it held this long.
QUIET_S = 4.0
#: The work sent shows in the counts within this (else the counts say nothing reached the replica).
SHOWS_WITHIN_S = 20.0


def _settled(run, previous: list, since: tuple | None = None, sent_at: float = 0.0) -> tuple | None:
    """Counters once they stop moving for QUIET_S and add up (every queued record computed or
    dropped); after sending, also once they moved from `since`, or SHOWS_WITHIN_S passed (a run
    here read two equal, stale readings 1.2 s apart as settled: 0 records enqueued, computed and dropped)."""
    now, at = _counters(run), time.monotonic()
    if not previous or previous[-1][1] != now:
        previous.append((at, now))  # (since when, reading)
    settled = at - previous[-1][0] >= QUIET_S and now[0] == now[1] + now[2]
    if since is not None and now == since and at - sent_at < SHOWS_WITHIN_S:
        return None
    return now if settled else None


def _measure(run, send) -> tuple[list, dict]:
    seen: list = []
    before = wait_for(lambda: _settled(run, seen), 60, "quiet counters before", interval_s=1.0)
    sent_at = time.monotonic()
    outcomes = asyncio.run(send())
    seen = []
    after = wait_for(lambda: _settled(run, seen, before, sent_at), 90, "quiet counters after", interval_s=1.0)
    enqueued, computed, cancelled = (a - b for a, b in zip(after, before))
    return outcomes, {"records_sent_by_clients": REQUESTS * RECORDS, "records_enqueued_at_replica": enqueued,
                      "records_computed": computed, "records_dropped_from_queue": cancelled}


@pytest.mark.smoke  # CI: make chaos-smoke
def test_deadline_is_504_promptly_and_queued_records_are_not_computed(chaos_run, figures):
    run = chaos_run

    async def send():
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as client:
            return await asyncio.gather(*(
                post(client, "/translation", translation_body(RECORDS, i * RECORDS),
                     headers={"X-Request-Timeout-Ms": str(DEADLINE_MS)}) for i in range(REQUESTS)))

    outcomes, counts = _measure(run, send)
    latencies = sorted(o.seconds for o in outcomes)
    figures["deadline"] = {**counts, "deadline_ms": DEADLINE_MS,
                           "status_counts": {str(s): sum(o.status == s for o in outcomes)
                                             for s in {o.status for o in outcomes}},
                           "max_latency_s": round(latencies[-1], 3), "median_latency_s": round(latencies[len(latencies) // 2], 3)}
    print(figures["deadline"])
    assert all(is_clean_error(o, 504, "timeout") for o in outcomes), [(o.status, o.body) for o in outcomes]
    # Promptly: the deadline plus the proxy/ingress path, far from the 60 s model timeout
    # (0.25 s over on a quiet machine; up to ~1.1 s over while other load saturated the 2 cores).
    assert latencies[-1] < DEADLINE_MS / 1000 + 2.0
    assert counts["records_dropped_from_queue"] > 0
    assert counts["records_computed"] <= counts["records_enqueued_at_replica"] / 2


def _disconnect(run) -> tuple[list, dict]:
    """12 clients of 64 records each close their connections once the Translator computes."""
    log_start = len(run.log_tail(10**9))
    replica = run.replica_pids("Translator")[0]

    async def send():
        async with httpx.AsyncClient(base_url=run.url, timeout=60) as client:
            # The event: the Translator computes, so records are queued behind its batch.
            tasks = await start_while_computing(client, replica, REQUESTS, RECORDS)
            gave_up = time.monotonic()
            for task in tasks:  # the clients go away: their connections are closed mid-request
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            return [(r, gave_up) for r in results]

    outcomes, counts = _measure(run, send)
    logged_499 = run.log_tail(10**9)[log_start:].count('"status":499')
    return outcomes, {**counts, "proxy": run.proxy,
                      "clients_closed_connections_after": "the Translator started computing",
                      "ingress_access_log_499": logged_499}


def _max_batch_size(run, deployment: str = "Translator") -> int:
    spec = next(d for d in run.config["applications"][0]["deployments"] if d["name"] == deployment)
    return int(spec["user_config"]["max_batch_size"])


def test_disconnected_client_cancels_its_queued_records(own_run, tmp_path, figures):
    """On Serve's Python proxy (`--proxy python`), a client that leaves cancels its request: the
    proxy cancels the ingress call, and no record that was not yet computing is computed, wherever
    it waited: the ingress's calls not yet sent, or the Translator's queue (dropped there).

    How many records reach the Translator's queue before the clients leave is up to the two cores:
    runs here had 264 (16 computed, 248 dropped from its queue) and 32 (one batch, all computing when
    the clients left, nothing behind it). So the bound is on what is computed: the batch running when
    the clients left, and at most one more that started before their cancellation reached the
    replica; of the 768 records sent, all would be computed without it."""
    run = ServeRun(tmp_path / "python-proxy", proxy="python")
    run.start()
    try:
        outcomes, counts = _disconnect(run)
    finally:
        run.stop()
    figures["disconnect"] = counts
    print(figures["disconnect"])
    assert run.proxy == "python"
    assert all(isinstance(r, asyncio.CancelledError) for r, _ in outcomes)
    assert counts["records_enqueued_at_replica"] > 0
    assert counts["records_computed"] <= 2 * _max_batch_size(run), counts
    assert counts["ingress_access_log_499"] >= 1


def test_disconnect_through_haproxy_is_measured(chaos_run, figures):
    """Measured, not enforced: through HAProxy (the default where a binary exists) most clients'
    disconnects do not reach the Ingress replica, because HAProxy keeps the server side of a
    request it has already forwarded open (its `abortonclose` drops only requests still queued in
    HAProxy). Those records are computed; each request's deadline still bounds them (the deadline
    test above passes on both proxies)."""
    if chaos_run.proxy != "haproxy":
        pytest.skip("the shared run uses Serve's Python proxy: test_disconnected_client_cancels_its_queued_records covers it")
    outcomes, counts = _disconnect(chaos_run)
    figures["disconnect_haproxy"] = counts
    print(figures["disconnect_haproxy"])
    assert all(isinstance(r, asyncio.CancelledError) for r, _ in outcomes)
    # Whatever HAProxy passes on, every record the replica took is accounted for: computed or dropped.
    assert counts["records_computed"] + counts["records_dropped_from_queue"] == counts["records_enqueued_at_replica"]
