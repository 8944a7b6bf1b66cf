"""A job's result in chunks: how a chunk of records is cut from the submission, stored compactly,
estimated before it exists, and put back together (whole or one page) for `GET /jobs/<id>`.

Stored forms: a translation chunk is its records as compact JSON; an embeddings chunk is its
vectors as float32 bytes (numpy; 1,536 bytes for a 384-dimension vector instead of ~8 KB of JSON
floats), with its token count; a custom model's chunk is its outputs as JSON. JSON is stored as
UTF-8 (non-ASCII text at its UTF-8 size, not as 6-byte `\\uXXXX` escapes); chunks stored with
escapes read back the same.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequest, describe_validation_errors
from ..schemas import EmbeddingsRequest, PredictRequest, TranslationPayload

#: an embedding's dimensions when the embedder cannot say (MiniLM's); a result is estimated before it is
#: computed at its served dimensions x 4 bytes (float32), and the bytes actually stored are counted once known
DEFAULT_EMBEDDING_DIM = 384
#: what one custom model output is estimated to take (corrected once stored)
PREDICT_BYTES_PER_INPUT = 512
#: JSON of one float32 as the routes answer it (`-0.012345678901234567,`): about 20 characters
_JSON_PER_FLOAT = 20


def estimate_bytes(task: str, body: BaseModel, embedding_dim: int = DEFAULT_EMBEDDING_DIM) -> int:
    """The result's stored size, estimated from the submission (reserved in the store's total); an
    embedding at `embedding_dim` float32s."""
    if task == "translation":
        assert isinstance(body, TranslationPayload)
        # a translation is rarely over twice its source's bytes; its id is echoed back
        return sum(2 * len(r.text.encode()) + len(r.id.encode()) + 16 for r in body.records)
    if task == "embeddings":
        assert isinstance(body, EmbeddingsRequest)
        return len(body.texts()) * embedding_dim * 4
    return len(body.inputs) * PREDICT_BYTES_PER_INPUT


def records_of(task: str, body: BaseModel) -> int:
    if task == "translation":
        return len(body.records)
    if task == "embeddings":
        return len(body.texts())
    return len(body.inputs)


def piece(task: str, body: BaseModel, start: int, stop: int) -> BaseModel:
    """The submission cut to its records [start, stop): what one chunk computes."""
    if task == "translation":
        return body.model_copy(update={"records": body.records[start:stop]})
    if task == "embeddings":
        return body.model_copy(update={"input": body.texts()[start:stop], "encoding_format": "float"})
    return body.model_copy(update={"inputs": body.inputs[start:stop]})


def _json(value: Any) -> bytes:
    """Compact JSON in UTF-8; a lone surrogate (valid in a JSON string, not in UTF-8) as its `\\u` escape."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def encode_chunk(task: str, response: BaseModel) -> tuple[dict, bytes]:
    """(meta, data) to store for one chunk's response."""
    if task == "translation":
        return {}, _json([[r.id, r.text] for r in response.result])
    if task == "embeddings":
        vectors = np.asarray([d.embedding for d in response.data], dtype=np.float32)
        return ({"model": response.model, "tokens": response.usage.prompt_tokens, "dim": int(vectors.shape[1])},
                vectors.astype("<f4").tobytes())
    return {"model": response.model}, _json(response.outputs)


def json_bytes_per_record(task: str, used_bytes: int, records: int) -> float:
    """About how many bytes of JSON one record of the result takes in a response."""
    per_record = used_bytes / max(records, 1)
    if task == "embeddings":
        return per_record / 4 * _JSON_PER_FLOAT + 40
    return per_record * 1.2 + 16


def render(task: str, chunks: list[tuple[int, tuple[int, dict, bytes]]], start: int, stop: int,
           tokens: int) -> dict[str, Any]:
    """The result body (as the task's route answers) of records [start, stop), from the stored
    chunks `(first record, (records, meta, data))` covering them, in order. `tokens`: the whole
    job's (embeddings usage)."""
    items: list[Any] = []
    model, base64_format = "", False
    for first, (records, meta, data) in chunks:
        lo, hi = max(start - first, 0), min(stop - first, records)
        if lo >= hi:
            continue
        model = meta.get("model", model)
        base64_format = meta.get("encoding_format") == "base64"
        if task == "embeddings":
            vectors = np.frombuffer(data, dtype="<f4").reshape(records, meta["dim"])[lo:hi]
            items += [(first + lo + i, v) for i, v in enumerate(vectors)]
        else:
            items += json.loads(data)[lo:hi]
    if task == "translation":
        return {"result": [{"id": i, "text": t} for i, t in items]}
    if task == "embeddings":
        data = [{"object": "embedding", "index": index,
                 "embedding": base64.b64encode(v.tobytes()).decode() if base64_format else v.tolist()}
                for index, v in items]
        return {"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return {"model": model or task, "outputs": items}


def encode_chunk_of(task: str, body: BaseModel, response: BaseModel) -> tuple[dict, bytes]:
    """`encode_chunk`, with what rendering needs from the submission (dropped once the job
    finished): the embeddings' `encoding_format`."""
    meta, data = encode_chunk(task, response)
    if task == "embeddings":
        meta["encoding_format"] = body.encoding_format
    return meta, data


#: the Pydantic model of each built-in task's submission (custom models: PredictRequest)
SUBMISSIONS: dict[str, type[BaseModel]] = {"translation": TranslationPayload, "embeddings": EmbeddingsRequest}


def submission_model(task: str) -> type[BaseModel]:
    return SUBMISSIONS.get(task, PredictRequest)


def parse_submission(task: str, payload: Any) -> BaseModel:
    """A job's payload as its task's request model; 422 `invalid_request` (fields under `payload.`) if not."""
    try:
        return submission_model(task).model_validate(payload)
    except ValidationError as exc:
        errors = [{**e, "loc": ("payload", *e["loc"])} for e in exc.errors()]
        raise InvalidRequest(describe_validation_errors(errors)) from None


def page_bounds(offset: Optional[int], limit: Optional[int], total: int, per_page: int) -> tuple[bool, int, int, int]:
    """(whole, start, stop, limit) of the records a `GET /jobs/<id>` answers: all of them when no
    paging was asked and they fit a page, else [offset, offset + limit) with limit at most a page."""
    whole = offset is None and limit is None and total <= per_page
    start = min(offset or 0, total)
    limit = total if whole else min(limit or per_page, per_page)
    return whole, start, min(start + limit, total), limit


def page_of(job_id: str, start: int, stop: int, limit: int, total: int) -> dict[str, Any]:
    """The `page` object of a paged result, with the link to the next page (None: the last)."""
    return {"offset": start, "limit": limit, "records": stop - start, "records_total": total,
            "next": f"/jobs/{job_id}?offset={stop}&limit={limit}" if stop < total else None}
