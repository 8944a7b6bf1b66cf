"""Does each contender start, answer with the model's own vectors, and stop? `make bench-smoke`.

    python -m bench.compare.smoke [--only mosec,litserve,infinity] [--port 9561]

For each contender: launch it as `make bench` does, send one embeddings request with several
texts of the benchmark's pool as soon as it answers, and compare every vector with the vector
the model gives that text alone, in this process (the offline single-input vector): each must
be within cosine 0.9999. Prints start-up to first answer and the process tree's PSS, stops the
server (nothing left running), and exits non-zero if any contender failed. Needs the CPU to
itself for the start-up figure: run it under /tmp/serve-app-cpu.lock (the make target does).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from bench.compare.contenders import CONTENDERS, Contender, contender_env
from bench.compare.procs import Server, ServerFailed
from bench.load import POOL
from bench.peers.models import ROOT, WORKLOADS, load_model

WORKLOAD = "embeddings"
MIN_COSINE = 0.9999
#: The new contenders of issue 24 (any contender may be named with --only).
DEFAULT = ("mosec", "litserve", "infinity")
TEXTS = tuple(POOL[:5])


def request_body(contender: Contender, texts: tuple[str, ...]) -> dict:
    return {"texts": list(texts)} if contender.body_kind == "texts" else {"input": list(texts)}


def vectors_of(answer) -> np.ndarray:
    """The vectors of an embeddings answer: OpenAI's shape ({"data": [{"index", "embedding"}]}), which
    serve-app, the contract peers and Infinity answer, or BentoML's (a list of vectors)."""
    if isinstance(answer, dict):
        rows = sorted(answer["data"], key=lambda d: d["index"])
        return np.asarray([row["embedding"] for row in rows], dtype=np.float64)
    return np.asarray(answer, dtype=np.float64)


def cosines(got: np.ndarray, expected: np.ndarray) -> list[float]:
    """Cosine of each answered vector with its expected vector (shape mismatch raises)."""
    if got.shape != expected.shape:
        raise ValueError(f"answered {got.shape} vectors, expected {expected.shape}")
    dots = (got * expected).sum(axis=1)
    return (dots / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))).tolist()


def smoke(contender: Contender, port: int, scratch: Path, expected: np.ndarray) -> dict:
    reason = contender.unavailable_for(WORKLOAD)
    if reason:
        return {"contender": contender.name, "ok": False, "error": reason}
    url = f"http://127.0.0.1:{port}"
    server = Server(contender.argv(WORKLOAD, port, scratch), contender_env(contender, WORKLOAD),
                    scratch / f"{contender.name}.log", ROOT)
    try:
        server.wait_ready(url + contender.ready_path, contender.ready_timeout_s)
        request = urllib.request.Request(url + WORKLOADS[WORKLOAD].route,
                                         data=json.dumps(request_body(contender, TEXTS)).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = json.loads(resp.read())
        first_answer_s = server.since_start()
        found = cosines(vectors_of(answer), expected)
        return {"contender": contender.name, "ok": min(found) >= MIN_COSINE, "min_cosine": min(found),
                "first_answer_s": round(first_answer_s, 1), "memory": server.memory()}
    except (ServerFailed, OSError, ValueError, KeyError) as exc:
        return {"contender": contender.name, "ok": False, "error": f"{exc}"[-1500:]}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--only", default=",".join(DEFAULT), help="comma-separated contenders")
    parser.add_argument("--port", type=int, default=9561)
    args = parser.parse_args()
    names = args.only.split(",")
    chosen = [c for c in CONTENDERS if c.name in names]
    if unknown := set(names) - {c.name for c in chosen}:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; known: {[c.name for c in CONTENDERS]}")
    run = load_model(WORKLOAD)
    expected = np.asarray([run([text])[0] for text in TEXTS], dtype=np.float64)  # one text per call
    del run
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        for contender in chosen:
            result = smoke(contender, args.port, Path(tmp), expected)
            failed += not result["ok"]
            print(json.dumps(result), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
