"""A `serve run` of serve_config.yaml for a benchmark that compares phases in one run."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator, Optional


@contextlib.contextmanager
def pinned_serve_run(url: Optional[str], prefix: str, *, replicas: int = 1,
                     args: Optional[dict] = None) -> Iterator[str]:
    """Yield `url` when given (a running service); else start `serve run` here with the
    Translator and the Embedder pinned at `replicas` each, yield its URL, and stop it on exit.

    Pinned because with autoscaling on, the load of one phase adds replicas that the next phase
    enjoys (or loses), and a comparison between phases would measure the autoscaler."""
    if url is not None:
        yield url
        return
    from tests.chaos.harness import ServeRun

    pinned = {"autoscaling_config": None, "num_replicas": replicas}
    run = ServeRun(Path(tempfile.mkdtemp(prefix=prefix)), args=args,
                   deployments={"Translator": pinned, "Embedder": pinned})
    print(f"serve run ready in {run.start():.1f} s at {run.url}", flush=True)
    try:
        yield run.url
    finally:
        run.stop()
