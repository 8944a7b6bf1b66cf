"""Records that crash a model's replicas are refused, not sent again and again.

An input that crashes the process computing it (a segfault, the OOM killer, a custom model's os._exit) costs two
replicas a call: the call's, then its one retry's (serve_app/handle_client.py). A client that retries the 503, as
serve_app/client does, and a job, which waits out 503s for jobs.model_retry_s, would send it again every few
seconds, replicas going down each time while every other request of the model gets 503s. So a model client counts
the replicas that died holding each call's records (method and arguments, whatever the request). The call at whose
`MAX_DEATHS`-th death within `ingress.crash_quarantine_s` gets 500 `model_crashed` instead of a retry, and so
does every call with the same records for that long, without reaching a replica. A replica lost to anything else
(a node, a SIGKILL) costs a call one death, retried and waited out as ever; three within the window for the very
same records is what crashing them looks like. Records answered are forgotten. A call that several requests share
(serve_app/coalescing.py) counts its death against each caller's records, which then go again alone: the innocent
ones are answered, and forgotten.

Per process (each Ingress replica, the JobManager): on a cluster a few more crashes happen before every Ingress
refuses them, and the same input inside another request's records (another call) is not recognised.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import time
from typing import Callable

from .errors import ModelCrashed

logger = logging.getLogger("serve_app")

#: replicas that die holding the same records within the quarantine before those are refused: the call at whose
#: death the count reaches it gets ModelCrashed instead of a retry or a 503
MAX_DEATHS = 3
#: most records remembered at once (the oldest are forgotten first)
MAX_REMEMBERED = 1024


class CrashQuarantine:
    """How many replicas died holding which records, and which records are refused now."""

    def __init__(self, name: str, quarantine_s: float, clock: Callable[[], float] = time.monotonic):
        self.name, self.quarantine_s, self._clock = name, quarantine_s, clock
        #: fingerprint -> (replicas that died holding those records, when the first did or the refusal began)
        self._deaths: dict[bytes, tuple[int, float]] = {}
        #: calls refused without reaching a replica (tests and logs read it)
        self.refused = 0

    @property
    def active(self) -> bool:
        """Whether any replica died holding records within the quarantine (else `check` refuses nothing)."""
        return bool(self._deaths)

    def check(self, method: str, args: tuple) -> None:
        """Raise ModelCrashed if these records are refused now. Costs nothing while no replica died."""
        if not self._deaths:
            return
        entry = self._entry(fingerprint(method, args))
        if entry is not None and entry[0] >= MAX_DEATHS:
            self.refused += 1
            raise crashed(self.name, entry[0], self.quarantine_s)

    def died(self, method: str, args: tuple) -> ModelCrashed | None:
        """Count a replica that died holding these records; the error to raise instead of a retry or a 503 once
        they are refused."""
        key = fingerprint(method, args)
        entry = self._entry(key)
        count, since = (entry[0] + 1, entry[1]) if entry else (1, self._clock())
        since = self._clock() if count >= MAX_DEATHS else since  # refused for quarantine_s from now
        self._deaths.pop(key, None)  # (re-inserted: the dict's order is the order to forget them in)
        self._deaths[key] = (count, since)
        while len(self._deaths) > MAX_REMEMBERED:
            self._deaths.pop(next(iter(self._deaths)))
        if count < MAX_DEATHS:
            return None
        logger.error("%s.%s: %d replicas died holding the same records within %g s; refused for as long",
                     self.name, method, count, self.quarantine_s)
        return crashed(self.name, count, self.quarantine_s)

    def answered(self, method: str, args: tuple) -> None:
        """These records were computed: a death they were counted in was not theirs (a node lost, another caller's
        input in a shared call), so it is forgotten."""
        if self._deaths:
            self._deaths.pop(fingerprint(method, args), None)

    def _entry(self, key: bytes) -> tuple[int, float] | None:
        entry = self._deaths.get(key)
        if entry is not None and self._clock() - entry[1] >= self.quarantine_s:
            del self._deaths[key]
            return None
        return entry


def crashed(name: str, count: int, quarantine_s: float) -> ModelCrashed:
    """The error of records refused after `count` replicas of model `name` died computing them."""
    return ModelCrashed(
        f"{count} {name} replicas died computing these records. They likely crash the model (a segfault, "
        f"out of memory) and are refused for {quarantine_s:g} s (ingress.crash_quarantine_s) rather than "
        "take more replicas down.")


def fingerprint(method: str, args: tuple) -> bytes:
    """The same for the same method and records: a Chunk (languages and texts), a list of texts or inputs."""
    try:
        data = pickle.dumps((method, args), protocol=5)
    except Exception:  # (an argument pickle refuses: named by its text)
        data = repr((method, args)).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).digest()


__all__ = ["MAX_DEATHS", "CrashQuarantine", "crashed", "fingerprint"]
