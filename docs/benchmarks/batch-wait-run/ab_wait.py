"""`make run`'s embeddings at 8 / 32 / 64 closed-loop clients with the Embedder's batch_wait_timeout_s varied
(docs/benchmarks/batch-wait-run). Usage: python ab_wait.py wait10,wait0,wait2 ROUNDS; one JSON line per start."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())  # run from the checkout's root
from bench.compare import load
from bench.placed_probe import _ready, PORT
from bench.load import POOL
from bench.peers.models import ROOT
from bench.compare.contenders import write_serve_app_config
out = Path("/tmp/wait-probe"); out.mkdir(exist_ok=True)
VARIANTS = {"wait10": None, "wait2": 0.002, "wait0": 0.0}
names = sys.argv[1].split(",")
rounds = int(sys.argv[2])
for r in range(rounds):
    order = names if r % 2 == 0 else names[::-1]
    for name in order:
        wait = VARIANTS[name]
        deps = None if wait is None else {"Ingress": {"user_config": {"Embedder": {"batch_wait_timeout_s": wait}}}}
        config = write_serve_app_config("embeddings", PORT, out / f"{name}.yaml", config="serve_config.placed.yaml", deployments=deps)
        proc = subprocess.Popen([sys.executable, "-m", "serve_app.run", str(config)],
                                env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", SERVE_APP_DRAIN_TIMEOUT_S="2"),
                                stdout=open(out / f"{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{PORT}"
        try:
            _ready(url)
            texts = load.write_texts(tuple(POOL), out / "texts.jsonl")
            target = load.Target(url, "/v1/embeddings", "embeddings", 1, tuple(POOL))
            load.run_closed(target, texts, 32, 15)
            row = {"round": r, "variant": name}
            for c in (8, 32, 64):
                res = load.run_closed(target, texts, c, 20)
                row[c] = {k: res.get(k) for k in ("requests_per_s", "p50_ms", "p99_ms", "errors") if k in res} or res
            print(json.dumps(row), flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(3)
