"""Asynchronous jobs (`POST /jobs`): an application-level service of the HTTP side.

- `job.py`: a job's record, states, errors and view (pure logic);
- `results.py`: what a job's result is made of, chunk by chunk, and its size;
- `store/`: where jobs live (SQLite on one machine, Redis on a cluster);
- `runner.py`: the engine (validate, store, compute in chunks, resume), without Ray;
- `manager.py`: the `JobManager` Serve deployment that wraps one runner (built by serve_app/builder.py);
- `api.py`: what the `/jobs` routes (serve_app/api.py) read from a request;
- `settings.py`: `args.jobs`.

A job is computed through the same `Service` as the HTTP routes, with its model calls marked
`background`; the model side (deployments/) knows nothing of jobs beyond that flag.
"""
