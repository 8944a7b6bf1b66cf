"""A/B of `make run`'s start (docs/benchmarks/launcher-run): first answer and PSS, variants alternated."""
import json, os, sys, time, urllib.request
from pathlib import Path
sys.path.insert(0, os.getcwd())  # run from the checkout's root
from bench.compare.procs import Server
PY = os.path.abspath(".venv/bin/python")
CFG = "serve_config.placed.yaml"
VARIANTS = {
    "old": ("/tmp/old-tree", f"{PY} -m serve_app.config_check {CFG} && exec {PY} -m serve_app.run {CFG}"),
    "new": (os.getcwd(), f"exec {PY} -m serve_app.run {CFG}"),
}
body = json.dumps({"input": "hello world", "model": "all-MiniLM-L6-v2"}).encode()
def answered():
    try:
        req = urllib.request.Request("http://127.0.0.1:9527/v1/embeddings", data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except Exception:
        return False
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3  # one JSON line per start on stdout
for r in range(rounds):
    order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
    for name in order:
        tree, cmd = VARIANTS[name]
        env = dict(os.environ, PYTHONPATH=tree)
        s = Server(["bash", "-c", cmd], env, Path(f"/tmp/ab_{name}_{r}.log"), Path(tree))
        while not answered():
            if s.proc.poll() is not None:
                raise SystemExit(f"{name} exited")
            time.sleep(0.05)
        first = s.since_start()
        time.sleep(5)
        mem = s.memory()
        s.stop()
        row = {"round": r, "variant": name, "first_answer_s": round(first, 2), "pss_mib": mem["pss_mib"], "processes": mem["processes"],
               "top": {k: v["pss_mib"] for k, v in list(mem["by_kind"].items())[:12]}}
        print(json.dumps(row), flush=True)
        time.sleep(3)
