"""What the jobs routes (serve_app/api.py) take from an HTTP request: who submits, and the
idempotency key."""

from __future__ import annotations

from ..middleware import api_key_id_of
from .job import ANONYMOUS

#: request header: the client's key for one submission; sent again (a retry) with the same body, it
#: answers the job the first attempt created; with another body, 409 `idempotency_key_reused`
IDEMPOTENCY_HEADER = "Idempotency-Key"

_IDEMPOTENCY_DESCRIPTION = (
    "A key of the client's choosing (e.g. a UUID) for this submission: sent again with the same body it "
    "returns the job the first attempt created instead of a second one; with another body it is 409 "
    "`idempotency_key_reused`. Remembered as long as its job. Without it, the same `x-request-id` "
    "and body count as the same submission (what a proxy's resend carries)."
)

_PAGE_DESCRIPTION = (
    "First record of the result to return; with `offset` or `limit` (or a result larger than "
    "jobs.max_page_bytes) the result comes a page at a time, with `page.next` linking the next page."
)


def job_owner(scope) -> str:
    """Whose job this request may see: the id of its API key (a hash, never the key), or
    `anonymous` while no keys are configured (then every caller is the same owner)."""
    return api_key_id_of(scope) or ANONYMOUS
