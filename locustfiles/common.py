"""What the load tests send and how they judge the answers.

Pure Python, no Locust import: importing `locust` monkey-patches the process
with gevent, so the unit tests (tests/load/test_locust_checks.py) import this
module alone. The texts are sentences.py's, the SLO verdict slo.py's; the Locust
glue (user base class, response handling, command-line SLO flags, the `quitting`
gate) lives in `base.py` and calls these functions.
"""

from __future__ import annotations

import itertools
import math
import random
import uuid
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Mapping, Optional

from sentences import SENTENCES

#: id prefix unique per process, so ids stay unique across distributed workers
_ID_PREFIX = uuid.uuid4().hex[:8]
_ID_COUNTER = itertools.count(1)


def new_id() -> str:
    return f"{_ID_PREFIX}-{next(_ID_COUNTER)}"


def pick_texts(n: int, rng: random.Random | None = None) -> list[str]:
    """`n` texts from the pool, drawn with replacement (so any `n` works)."""
    rng = rng or random
    return [rng.choice(SENTENCES) for _ in range(n)]


def translation_payload(n_records: int, rng: random.Random | None = None, *,
                        from_lang: str = "en", to_lang: str = "pt") -> dict[str, Any]:
    """`{"payload": {...}}` with `n_records` records, each with a fresh unique id."""
    if n_records < 1:
        raise ValueError("n_records must be >= 1")
    return {"payload": {"fromLang": from_lang, "toLang": to_lang,
                        "records": [{"id": new_id(), "text": t} for t in pick_texts(n_records, rng)]}}


def embeddings_payload(n_inputs: int, rng: random.Random | None = None) -> dict[str, Any]:
    """`{"input": "text"}` for one input, `{"input": [...]}` for more."""
    if n_inputs < 1:
        raise ValueError("n_inputs must be >= 1")
    texts = pick_texts(n_inputs, rng)
    return {"input": texts[0] if n_inputs == 1 else texts}


# ----------------------------------------------------------------------------
# Body checkers: return None when the body is right, else a one-line problem.
# ----------------------------------------------------------------------------

EMBEDDING_DIM = 384


def check_translation(request: Mapping[str, Any], body: Any) -> Optional[str]:
    """Same number of records, same ids in the same order, each text a non-blank string."""
    sent = request["payload"]["records"]
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        return "translation body has no 'result' list"
    got = body["result"]
    if len(got) != len(sent):
        return f"translation returned {len(got)} records for {len(sent)} sent"
    for i, (s, g) in enumerate(zip(sent, got)):
        if not isinstance(g, dict):
            return f"translation result[{i}] is not an object"
        if g.get("id") != s["id"]:
            return f"translation result[{i}] has id {g.get('id')!r}, expected {s['id']!r} (order or ids changed)"
        text = g.get("text")
        if not isinstance(text, str) or not text.strip():
            return f"translation result[{i}] (id {s['id']!r}) has empty or missing text"
    return None


def check_embeddings(request: Mapping[str, Any], body: Any, *, dim: int = EMBEDDING_DIM,
                     norm_tolerance: float = 0.02) -> Optional[str]:
    """One vector per input, indexes 0..n-1 in order, `dim` finite floats, norm ~1."""
    inputs = request["input"]
    n = 1 if isinstance(inputs, str) else len(inputs)
    if not isinstance(body, dict) or body.get("object") != "list" or not isinstance(body.get("data"), list):
        return "embeddings body is not an object of type 'list' with a 'data' list"
    data = body["data"]
    if len(data) != n:
        return f"embeddings returned {len(data)} vectors for {n} inputs"
    for i, item in enumerate(data):
        if not isinstance(item, dict) or item.get("index") != i:
            return f"embeddings data[{i}] has index {item.get('index') if isinstance(item, dict) else None!r}"
        vector = item.get("embedding")
        if not isinstance(vector, list) or len(vector) != dim:
            size = len(vector) if isinstance(vector, list) else type(vector).__name__
            return f"embeddings data[{i}] has {size} values, expected {dim} floats"
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector):
            return f"embeddings data[{i}] holds non-numeric or non-finite values"
        norm = math.sqrt(sum(x * x for x in vector))
        if abs(norm - 1.0) > norm_tolerance:
            return f"embeddings data[{i}] has norm {norm:.4f}, expected ~1"
    return None


# ----------------------------------------------------------------------------
# Response classification (Locust-free so it can be unit tested).
# ----------------------------------------------------------------------------

DEFAULT_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 30.0


def parse_retry_after(value: Optional[str], *, default: float = DEFAULT_RETRY_AFTER_S,
                      cap: float = MAX_RETRY_AFTER_S, now: Optional[float] = None) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), clamped to [0, cap]."""
    if value is None or not str(value).strip():
        return default
    value = str(value).strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return default
        import time as _time
        seconds = when.timestamp() - (now if now is not None else _time.time())
    if not math.isfinite(seconds):
        return default
    return min(max(seconds, 0.0), cap)


@dataclass(frozen=True)
class Outcome:
    """What to record for one response: `kind` is ok, shed or fail."""

    kind: str
    message: str = ""
    retry_after_s: float = 0.0


def classify(status: int, headers: Mapping[str, str] | None, read_json: Callable[[], Any],
             checker: Callable[[Mapping[str, Any], Any], Optional[str]], request: Mapping[str, Any],
             error: Any = None) -> Outcome:
    """200 with a right body: ok; 200 with a wrong body: fail; 503: shed; anything else: fail."""
    if status == 200:
        try:
            body = read_json()
        except Exception as exc:  # noqa: BLE001 - any decode problem is a failure
            return Outcome("fail", f"200 with a body that is not JSON: {exc}")
        problem = checker(request, body)
        return Outcome("fail", f"200 with a wrong body: {problem}") if problem else Outcome("ok")
    if status == 503:
        retry = (headers or {}).get("Retry-After")
        return Outcome("shed", "503 shed", parse_retry_after(retry))
    if not status:
        return Outcome("fail", f"no HTTP response: {error!r}")
    error_type = ""
    try:
        body = read_json()
        if isinstance(body, dict):
            error_type = f" {body.get('error_type', '')}".rstrip()
    except Exception:  # noqa: BLE001
        pass
    return Outcome("fail", f"HTTP {status}{error_type}")
