"""The models placed in the Ingress (serve_config.placed.yaml, `placement: ingress`), on a run of
their own: what the app has, that requests, job work and metrics reach the models there, and that
`serve deploy` of a new batch size in the Ingress's user_config reconfigures them in place (no
Ingress replica restarts, no failed request) as it does a model deployment's."""

from __future__ import annotations

import copy
import time

import httpx

from tests.support import SETOSA

from .harness import ServeRun, running_replica_ids, serve_deploy, serve_details, wait_for
from .helpers import translation_body, under_load


def test_models_placed_in_the_ingress_serve_jobs_metrics_and_reconfigure_in_place(own_run, tmp_path, figures):
    run = ServeRun(tmp_path / "placed", config="serve_config.placed.yaml")
    try:
        took = run.start()
        apps = serve_details(run)["applications"]
        deployments = set(apps["serve-app"]["deployments"])
        assert deployments == {"Ingress", "JobManager"}, deployments

        translated = httpx.post(f"{run.url}/translation", json=translation_body(3), timeout=60)
        assert translated.status_code == 200, translated.text
        assert [r["id"] for r in translated.json()["result"]] == ["r0", "r1", "r2"]
        embedded = httpx.post(f"{run.url}/embeddings", json={"input": ["placed", "in the ingress"]}, timeout=60)
        assert embedded.status_code == 200 and len(embedded.json()["data"]) == 2, embedded.text
        predicted = httpx.post(f"{run.url}/models/iris/predict", json={"inputs": [SETOSA]}, timeout=60)
        assert predicted.status_code == 200 and predicted.json()["outputs"][0]["species"] == "setosa", predicted.text

        # Job work: JobManager -> Ingress.call_placed -> the placed model's background queue.
        job = httpx.post(f"{run.url}/jobs", json={"task": "translation", "payload": translation_body(4)["payload"]},
                         timeout=30)
        assert job.status_code == 202, job.text
        done = wait_for(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
            httpx.get(f"{run.url}/jobs/{job.json()['job_id']}", timeout=10).json()), 60, "the job to finish", 0.2)
        assert done["status"] == "succeeded", done
        assert len(done["result"]["result"]) == 4

        # The model's metrics come from the Ingress replica, told apart by the `model` tag.
        def counted():
            scraped = run.scrape()
            return [labels for (name, labels), value in scraped.items()
                    if name == "ray_serve_app_records_total" and value > 0]
        series = wait_for(lambda: (lambda s: s if len(s) >= 3 else None)(counted()), 30, "serve_app_records_total")
        tags = {(dict(labels)["deployment"], dict(labels)["model"]) for labels in series}
        assert {("Ingress", "Translator"), ("Ingress", "Embedder"), ("Ingress", "Model.iris")} <= tags, tags

        # A batch knob through the Ingress's user_config, under load: in place.
        ids = wait_for(lambda: running_replica_ids(run, "Ingress") or None, 30, "a RUNNING Ingress")
        config = copy.deepcopy(run.config)
        ingress = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Ingress")
        old = ingress["user_config"]["Translator"]["max_batch_size"]
        ingress["user_config"]["Translator"]["max_batch_size"] = old // 2

        def applied():
            cards = httpx.get(f"{run.url}/v1/models", timeout=10).json()["data"]
            return next(c for c in cards if c["deployment"] == "Translator")["batching"]["max_batch_size"] == old // 2

        outcomes, deploy_s = under_load(run, lambda: serve_deploy(run, config), applied)
        failed = [o for o in outcomes if o.status != 200]
        after = running_replica_ids(run, "Ingress")
        figures["placed_user_config_update"] = {
            "ready_s": round(took, 1), "requests": len(outcomes), "failed": len(failed),
            "serve_deploy_s": round(deploy_s, 1), "ingress_replicas_replaced": len(ids - after),
            "ingress_replicas_added": len(after - ids)}
        print(figures["placed_user_config_update"])
        assert failed == [], [(o.status, o.error) for o in failed]
        # In place: every Ingress replica of before still runs (the autoscaler may have added one
        # under the load; that is not a restart).
        assert ids <= after, (ids, after)
    finally:
        stopped = time.monotonic()
        run.stop()
        print(f"placed run stopped in {time.monotonic() - stopped:.1f} s")
