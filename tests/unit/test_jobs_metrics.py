"""The JobManager's gauges (serve_app/jobs/metrics.py) from a real runner on a SQLite store: jobs by status, their
results' bytes and the lease; jobs had no metric at all (from the metrics review): a backlog, failures and a lost
lease showed only in the logs."""

from __future__ import annotations

import asyncio

from serve_app.jobs.metrics import JobGauges, export_forever

from .test_jobs import _finished, _runner, _translation


class FakeGauge:
    def __init__(self, name, description, tag_keys=()):
        self.name, self.tag_keys, self.values = name, tuple(tag_keys), {}

    def set(self, value, tags=None):
        assert set(tags or {}) == set(self.tag_keys)
        self.values[tuple(sorted((tags or {}).items()))] = value


def test_the_gauges_show_the_jobs_by_status_their_bytes_and_the_lease(tmp_path):
    made = {}

    def gauge(name, description, tag_keys=()):
        made[name] = FakeGauge(name, description, tag_keys)
        return made[name]

    async def scenario():
        runner, _, _ = await _runner(tmp_path)
        gauges = JobGauges(gauge)
        done = await runner.submit("translation", _translation(20))
        await _finished(runner, done["job_id"])
        runner.holding = False  # (as after a lost lease: nothing computes the next one)
        await runner.submit("translation", _translation(3))
        exporter = asyncio.create_task(export_forever(runner.stats, gauges, interval_s=0.01))
        await asyncio.sleep(0.1)
        exporter.cancel()
        await asyncio.gather(exporter, return_exceptions=True)
        await runner.stop()

    asyncio.run(scenario())
    jobs = {dict(k)["status"]: v for k, v in made["serve_app_jobs"].values.items()}
    assert jobs == {"queued": 1, "running": 0, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert made["serve_app_jobs_result_bytes"].values[()] > 0
    assert made["serve_app_jobs_lease_held"].values[()] == 0
