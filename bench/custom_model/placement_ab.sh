#!/bin/bash
# Your own model (examples/iris_classifier.py, Model.iris) in its own deployment (serve_config.yaml)
# against placed in the Ingress (serve_config.placed.yaml), each started as `make run` starts it on
# port 9641, two rounds interleaved; wrk with 1 client (latency alone) and 64 clients (throughput),
# one flower per request, 15 s each after a 3 s warm-up. docs/benchmarks/placement.md quotes it.
#   flock /tmp/serve-app-cpu.lock bench/custom_model/placement_ab.sh
set -u
cd "$(dirname "$0")/../.."
here=bench/custom_model
export RAY_USAGE_STATS_ENABLED=0 SERVE_APP_CACHE_ENABLED=false
cfg_out=$(mktemp -d)
for round in 1 2; do
  for cfg in serve_config.yaml serve_config.placed.yaml; do
    .venv/bin/python -m serve_app.config_check "$cfg" --port 9641 --write "$cfg_out/serve_config.yaml" >/dev/null || exit 1
    setsid .venv/bin/python -m serve_app.run "$cfg_out/serve_config.yaml" > "$cfg_out/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do curl -sf localhost:9641/readyz >/dev/null && break; sleep 1; done
    wrk -t1 -c8 -d3s -s "$here/iris.lua" http://127.0.0.1:9641/models/iris/predict > /dev/null
    for clients in 1 64; do
      echo "=== round $round $cfg clients $clients"
      wrk -t1 -c"$clients" -d15s --latency -s "$here/iris.lua" http://127.0.0.1:9641/models/iris/predict \
        | grep -E "Requests/sec|50%|99%|status|Non-2xx"
    done
    kill -TERM "$pid"; wait "$pid"
  done
done
