# The serve-app image that KubeRay runs (head, workers, model-cache Job).
#
#   docker build -t registry.example.com/serve-app:0.1.0-ray2.60.0-py311 .
#   docker build --build-arg VARIANT=-gpu -t registry.example.com/serve-app:0.1.0-ray2.60.0-py311-gpu .
#
# Tag = <pyproject version>-ray<RAY_VERSION>-<PYTHON_TAG><VARIANT>: the base image's tag
# prefixed with the project's version, as used in kuberay/*.yaml. RAY_VERSION and
# PYTHON_TAG must match pyproject.toml (ray[serve]==..., requires-python); tests/deploy
# check it.
ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311
# "" (CPU) or "-gpu" (CUDA base image).
ARG VARIANT=
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}${VARIANT}
ARG VARIANT
# torch first. CPU image: the CPU-only wheel from PyTorch's CPU index (~200 MB); PyPI's
# default Linux wheel bundles CUDA libraries (several GB) that a CPU node never uses.
# GPU image: PyPI's default wheel, built with CUDA.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN if [ -z "${VARIANT}" ]; then \
        pip install --no-cache-dir "${TORCH_SPEC}" --index-url "${TORCH_CPU_INDEX}"; \
    else \
        pip install --no-cache-dir "${TORCH_SPEC}"; \
    fi

WORKDIR /home/ray/serve-app
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users serve_app ./serve_app
COPY --chown=ray:users deployments ./deployments
# The bring-your-own-model example registered in the Serve config (`models:`); your own model
# modules go here too (or in a package of their own that you install).
COPY --chown=ray:users examples ./examples
# A regular (non-editable) install: serve_app.builder:build_app is importable from any
# working directory, which is where KubeRay's `ray start` runs. ray[serve]==2.60.0 is
# already in the base image, so pip keeps it. The ctranslate2 extra makes
# `translation.backend: ctranslate2` available (int8 on CPU).
RUN pip install --no-cache-dir ".[ctranslate2]"

ENV RAY_USAGE_STATS_ENABLED=0
