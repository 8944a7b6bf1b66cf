"""serve-app's HTTP contract, for the peers that speak it (naive, service_streamer, MLPool, mosec, LitServe).

Same request bodies as serve-app (validated with pydantic, as a FastAPI user would),
same response shapes, so the load generator sends identical requests to every
contender (mosec and LitServe included). BentoML and Infinity speak their own.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

from pydantic import BaseModel, Field

EMBEDDING_MODEL = "all-MiniLM-L6-v2"


class Record(BaseModel):
    id: str
    text: str


class Payload(BaseModel):
    fromLang: str
    toLang: str
    records: list[Record] = Field(..., min_length=1)


class TranslationRequest(BaseModel):
    payload: Payload


class EmbeddingsRequest(BaseModel):
    input: Union[str, list[str]]
    model: str = EMBEDDING_MODEL


def texts_of(workload: str, body: dict) -> list[str]:
    """The texts a request body carries (raises pydantic.ValidationError on a bad body)."""
    if workload == "embeddings":
        request = EmbeddingsRequest.model_validate(body)
        return [request.input] if isinstance(request.input, str) else list(request.input)
    return [r.text for r in TranslationRequest.model_validate(body).payload.records]


def response_of(workload: str, body: dict, outputs: Sequence) -> dict:
    """The response body for `outputs` (one per text, in order)."""
    if workload == "embeddings":
        return {"object": "list", "model": EMBEDDING_MODEL,
                "data": [{"object": "embedding", "index": i, "embedding": [float(x) for x in vector]}
                         for i, vector in enumerate(outputs)]}
    records = body["payload"]["records"]
    return {"result": [{"id": r["id"], "text": text} for r, text in zip(records, outputs)]}


def outputs_per_request(run: Callable[[Sequence[str]], list], texts_per_request: Sequence[Sequence[str]]) -> list[list]:
    """One model call for a batch of requests (a batching server's batch): every request's texts in one
    list, then each request's outputs back in its own order."""
    flat = [text for texts in texts_per_request for text in texts]
    outputs = run(flat) if flat else []
    split, start = [], 0
    for texts in texts_per_request:
        split.append(outputs[start:start + len(texts)])
        start += len(texts)
    return split
