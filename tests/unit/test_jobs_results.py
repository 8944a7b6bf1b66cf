"""A job's stored result (serve_app/jobs/results.py): JSON chunks at their UTF-8 size, within the
size estimated at submission, read back the same (lone surrogates and chunks stored escaped too)."""

import json

from serve_app.jobs.results import encode_chunk, estimate_bytes, render
from serve_app.schemas import PredictResponse, TranslatedRecord, TranslationPayload, TranslationResponse

RU = "Доброе утро, как у вас сегодня дела? " * 30


def _rendered(data: bytes, records: int) -> list[dict]:
    return render("translation", [(0, (records, {}, data))], 0, records, 0)["result"]


def test_a_non_ascii_translation_is_stored_at_its_utf8_size_within_its_estimate():
    payload = TranslationPayload.model_validate(
        {"fromLang": "en", "toLang": "ru", "records": [{"id": "1", "text": "Good morning, how are you today? " * 30}]})
    _, data = encode_chunk("translation", TranslationResponse(result=[TranslatedRecord(id="1", text=RU)]))
    assert len(data) == len(json.dumps([["1", RU]], separators=(",", ":"), ensure_ascii=False).encode())
    assert len(data) <= estimate_bytes("translation", payload)
    assert _rendered(data, 1) == [{"id": "1", "text": RU}]


def test_lone_surrogates_and_chunks_stored_escaped_read_back_the_same():
    texts = ["a\ud800b", "\\\udfff", "日本語 🙂", RU[:40]]
    response = TranslationResponse(result=[TranslatedRecord(id=str(i), text=t) for i, t in enumerate(texts)])
    _, data = encode_chunk("translation", response)
    data.decode("utf-8")  # valid UTF-8
    expected = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    assert _rendered(data, len(texts)) == expected
    escaped = json.dumps([[str(i), t] for i, t in enumerate(texts)], separators=(",", ":")).encode()
    assert _rendered(escaped, len(texts)) == expected  # as chunks were stored before
    _, outputs = encode_chunk("classifier", PredictResponse(model="m", outputs=[{"label": "кошка"}]))
    assert outputs == '[{"label":"кошка"}]'.encode()
