"""serve-app on one GPU (issues 20 and 25): `python -m bench.gpu --out DIR [--quick]`.

What it measures, each phase in a process of its own with a time budget (a phase that fails or
runs out of time is reported, and the next one still runs):

* ``build`` (models.py): an M2M100-418M-*sized* random model (d_model 1024, 12+12 layers, 16 heads,
  FFN 4096, vocabulary 128,112) saved in float16, and a random MiniLM-*shaped* BERT for the Embedder,
  both with tokenizers built offline, into the git-ignored .bench-models/.
* ``offline`` (offline.py): the project's TransformersBackend on the GPU in float16, decode length
  fixed (min_new_tokens == max_new_tokens), batches of 1 to 128: records/s and time per batch; the
  best batch is the offline limit.
* ``serve-static`` (serving.py, http_load.py): the Serve application of the GPU profile
  (deploy.serve_profiles "gpu"/"local", only the model paths, decode length, cache and job store
  changed), started as `make run` starts it (`python -m serve_app.run`); checks 2 Translator replicas
  RUNNING at num_gpus 0.5 on one GPU (nvidia-smi), device cuda / float16 in /v1/models; closed-loop
  HTTP cells (clients x records per request): records/s, p50/p99, statuses, ratio to the offline limit.
* ``continuous`` (continuous.py): static vs continuous batching (`translation.scheduling`), the
  Translator replica class in-process on the GPU, on the per-sentence output-length mix
  (saturation, p50/p99 at half load, p50 over solo time) and on the fixed-length workload.
* ``serve-continuous``: the Serve run again with `scheduling: continuous`, if time is left.

Two tools beside the phases, each `--out DIR`, runnable where Ray is not installed:

* ``python -m bench.gpu.step_probe``: where a decoder step's time goes (wall, kernel time, top ops by
  device and CPU time), continuous and static, on batches shaped like each workload.
* ``python -m bench.gpu.engines`` (`make bench-gpu-engines`): static batching, service_streamer and
  continuous batching engine against engine on the same backend, latency against load.

Results: DIR/results.json, DIR/results.md, DIR/results.png (report.py; `--plot DIR/results.json` draws
the PNG elsewhere when matplotlib is missing). `--device cpu --tiny` runs the same flow on a CPU box
with the tiny M2M100 test fixture.
"""
