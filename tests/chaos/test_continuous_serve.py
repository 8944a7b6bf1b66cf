"""Continuous batching through Serve (issue 25): the Translator on `translation.scheduling:
continuous` with a transformers model (the tiny fixture Marian, en->de), on a run of its own.

Concurrent HTTP requests of different sizes share the running batch; each record's text must
equal single-input greedy `generate` of the same model in this process. `/v1/models` names the
scheduling mode, the decode metrics reach Prometheus, a job's records (background priority)
go through the same loop, and a paragraph the model cuts short comes back translated in pieces."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fixtures.tiny_models import build_tiny_marian

from .harness import ServeRun, wait_for

MAX_NEW_TOKENS = 12
TEXTS = [
    "Hello.", "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Where is the train station?", "a", "Numbers like 1, 2, 3 and 42.", "Good morning, how are you today?",
    "The weather is nice.", "Please send me the report before Friday so that we can review it together.",
]


def _body(texts: list[str], first_id: int) -> dict:
    return {"payload": {"fromLang": "en", "toLang": "de",
                        "records": [{"id": str(first_id + i), "text": t} for i, t in enumerate(texts)]}}


@pytest.mark.smoke  # CI: make chaos-smoke (about 30 s)
def test_continuous_scheduling_through_serve_answers_as_single_input_generate(own_run, tmp_path, figures):
    from deployments.backends.segments import CutText, join
    from deployments.backends.transformers_backend import TransformersBackend
    from deployments.translator import pieces_of

    model = build_tiny_marian(tmp_path / "marian", pair=("en", "de"))
    offline = TransformersBackend(str(model), device="cpu", local_files_only=True, max_new_tokens=MAX_NEW_TOKENS)
    expected = {t: offline.translate([t], "en", "de")[0] for t in TEXTS}
    run = ServeRun(tmp_path / "run", args={"translation": {
        "backend": "transformers", "model": str(model), "local_files_only": True, "device": "cpu",
        "max_new_tokens": MAX_NEW_TOKENS, "scheduling": "continuous", "max_running_sequences": 8}})
    try:
        ready_s = run.start()
        card = next(c for c in httpx.get(f"{run.url}/v1/models", timeout=30).json()["data"]
                    if c["deployment"] == "Translator")
        assert card["details"]["scheduling"] == "continuous", card
        assert card["details"]["continuous"]["max_running_sequences"] == 8, card

        draws = random.Random(25)
        requests = [[draws.choice(TEXTS) for _ in range(draws.randint(1, 3))] for _ in range(24)]

        def send(i: int) -> tuple[list[str], httpx.Response]:
            return requests[i], httpx.post(f"{run.url}/translation", json=_body(requests[i], 100 * i), timeout=120)

        with ThreadPoolExecutor(12) as pool:  # 12 in flight: they join and leave one running batch
            answers = list(pool.map(send, range(len(requests))))
        for i, (texts, answer) in enumerate(answers):
            assert answer.status_code == 200, answer.text
            got = answer.json()["result"]
            assert [r["id"] for r in got] == [str(100 * i + k) for k in range(len(texts))]
            assert [r["text"] for r in got] == [expected[t] for t in texts], (texts, got)

        job = httpx.post(f"{run.url}/jobs", json={"task": "translation", "payload": _body(TEXTS, 0)["payload"]},
                         timeout=30)
        assert job.status_code == 202, job.text
        done = wait_for(lambda: (lambda j: j if j["status"] in ("succeeded", "failed") else None)(
            httpx.get(f"{run.url}/jobs/{job.json()['job_id']}", timeout=10).json()), 120, "the job to finish", 0.2)
        assert done["status"] == "succeeded", done
        assert [r["text"] for r in done["result"]["result"]] == [expected[t] for t in TEXTS]

        # A paragraph the model cuts short (its output uses all MAX_NEW_TOKENS) comes back as its
        # pieces' translations, joined (deployments/translator.py `pieces_of`), through HTTP too.
        paragraph = "The weather is nice. Where is the train station? Good morning, how are you today?"
        assert isinstance(offline.translate([paragraph], "en", "de")[0], CutText)
        pieces = pieces_of(paragraph, MAX_NEW_TOKENS)
        whole = httpx.post(f"{run.url}/translation", json=_body([paragraph], 0), timeout=120)
        assert whole.status_code == 200, whole.text
        assert whole.json()["result"][0]["text"] == join(offline.translate([p for p, _ in pieces], "en", "de"), pieces)

        def decode_metrics():
            scraped = run.scrape()
            steps = sum(v for (name, _), v in scraped.items() if name == "ray_serve_app_decode_running_sequences_count")
            alone = sum(v for (name, labels), v in scraped.items()
                        if name == "ray_serve_app_decode_running_sequences_bucket" and float(dict(labels)["le"]) == 1)
            return (steps, alone) if steps > 0 else None
        steps, alone = wait_for(decode_metrics, 60, "the decode metrics in Prometheus", 1.0)
        assert alone < steps, "no decoding step ran more than one sentence"
        figures["continuous_through_serve"] = {
            "ready_s": round(ready_s, 1), "requests": len(requests), "records": sum(map(len, requests)),
            "job_records": len(TEXTS), "decode_steps": steps, "steps_with_one_sentence": alone}
        print(figures["continuous_through_serve"])
    finally:
        run.stop()
