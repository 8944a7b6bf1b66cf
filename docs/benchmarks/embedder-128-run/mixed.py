"""Mixed load on make run's placed start: 16 clients x 16 texts, and beside them 1 client x 1 text, for the
Embedder's cap of 64 and 128 texts, two rounds in alternating order. Run from the checkout's root:

    flock /tmp/serve-app-cpu.lock .venv/bin/python docs/benchmarks/embedder-128-run/mixed.py
"""
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from bench import placed_probe as pp
from bench.compare import load
from bench.load import POOL
from bench.compare.contenders import write_serve_app_config

out = Path("/tmp/mixed"); out.mkdir(exist_ok=True)
def run(name, cap, bulk_clients, seconds=20):
    config = write_serve_app_config("embeddings", pp.PORT, out / f"{name}.yaml", config="serve_config.placed.yaml",
                                    deployments={"Ingress": {"user_config": {"Embedder": {"max_batch_size": cap}}}})
    proc = subprocess.Popen([sys.executable, "-m", "serve_app.run", "--address", "local", str(config)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", SERVE_APP_DRAIN_TIMEOUT_S="2"),
                            stdout=open(out / f"{name}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{pp.PORT}"
    try:
        pp._ready(url)
        texts = load.write_texts(tuple(POOL), out / "texts.jsonl")
        bulk = load.Target(url, "/v1/embeddings", "embeddings", 16, tuple(POOL))
        one = load.Target(url, "/v1/embeddings", "embeddings", 1, tuple(POOL))
        load.run_closed(bulk, texts, bulk_clients, 15)
        res = {}
        t = threading.Thread(target=lambda: res.update(bulk=load.run_closed(bulk, texts, bulk_clients, seconds)))
        t.start(); time.sleep(1)
        res["one"] = load.run_closed(one, texts, 1, seconds - 3)
        t.join()
        return {"variant": name, "cap": cap, "bulk_clients": bulk_clients,
                "bulk_texts_s": res["bulk"]["records_per_s"], "bulk_p50": res["bulk"]["p50_ms"],
                "one_p50": res["one"]["p50_ms"], "one_p99": res["one"]["p99_ms"], "one_rps": res["one"]["requests_per_s"]}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try: proc.wait(60)
        except subprocess.TimeoutExpired: os.killpg(proc.pid, signal.SIGKILL)

for rnd in range(2):
    vs = [("b64", 64), ("b128", 128)]
    for name, cap in (vs if rnd == 0 else vs[::-1]):
        print(json.dumps({"round": rnd, **run(name, cap, 16)}), flush=True)
