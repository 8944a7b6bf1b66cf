# The serve-app image that KubeRay runs (head, workers, model-cache Job).
#
#   docker build -t registry.example.com/serve-app:0.1.0-ray2.60.0-py311 .
#   docker build --build-arg VARIANT=-gpu -t registry.example.com/serve-app:0.1.0-ray2.60.0-py311-gpu .
#
# Tag = <pyproject version>-ray<RAY_VERSION>-<PYTHON_TAG><VARIANT>: the base image's tag
# prefixed with the project's version, as used in kuberay/*.yaml. RAY_VERSION and
# PYTHON_TAG must match pyproject.toml (ray[serve]==..., requires-python); tests/deploy
# check it.
#
# Reproducible builds: pin the base image by digest as well as by tag, e.g.
#   docker build --build-arg BASE_DIGEST=@$(docker buildx imagetools inspect \
#       rayproject/ray:2.60.0-py311 --format '{{json .Manifest.Digest}}' | tr -d '"') .
# (the digest of the tag on the day you pin it; docs/security.md). Every Python package comes
# from requirements.lock.
ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311
# "" (CPU) or "-gpu" (CUDA base image).
ARG VARIANT=
# "" or "@sha256:<64 hex digits>": the base image's digest.
ARG BASE_DIGEST=
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}${VARIANT}${BASE_DIGEST}
ARG VARIANT

# The base image gives its `ray` user (uid 1000, group users = 100) passwordless sudo: take it
# away, and fail the build if `ray` can still become root.
USER root
RUN (gpasswd -d ray sudo 2>/dev/null || true) \
    && sed -i '/^ray[[:space:]]/d;/NOPASSWD/d' /etc/sudoers \
    && rm -f /etc/sudoers.d/ray \
    && if su ray -s /bin/sh -c 'sudo -n true' 2>/dev/null; then echo "ray still has sudo" >&2; exit 1; fi
USER 1000:100

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
# The dependencies, in a layer of their own: rebuilt only when pyproject.toml or the lock
# changes, not on every code change. Exactly the versions of requirements.lock (constraints:
# a CPU torch never asks for the CUDA libraries it also pins). ray[serve]==2.60.0 is already
# in the base image. The ctranslate2 extra makes `translation.backend: ctranslate2` available
# (int8 on CPU); the onnx extra, `embeddings.engine: onnx`; the examples extra, the iris model the
# Serve configs serve.
COPY --chown=ray:users pyproject.toml requirements.lock README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['ctranslate2'] \
+ p['optional-dependencies']['onnx'] + p['optional-dependencies']['examples']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -c requirements.lock -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY --chown=ray:users serve_app ./serve_app
COPY --chown=ray:users deployments ./deployments
# The bring-your-own-model example registered in the Serve config (`models:`); your own model
# modules go here too (or in a package of their own that you install).
COPY --chown=ray:users examples ./examples
# A regular (non-editable) install of the code alone (its dependencies are in the layer above):
# serve_app.builder:build_app is importable from any working directory, which is where
# KubeRay's `ray start` runs.
RUN pip install --no-cache-dir --no-deps .

# The embedder's ONNX export (embeddings.engine: onnx in the cpu profiles), made once here with torch
# and checked against it (deployments/backends/embedding_onnx.py), so that a replica replacing one on
# a lost pod loads it in about a second instead of importing torch. In the image, not in ~/.cache
# (an emptyDir in the pods); the root filesystem is read-only there, which is fine: it is only read.
ENV SERVE_APP_EMBEDDINGS_ONNX_CACHE_DIR=/home/ray/serve-app/onnx
RUN python -m deployments.backends.embedding_onnx

ENV RAY_USAGE_STATS_ENABLED=0
