"""A small typed client for serve-app over HTTP, sync and async.

    from serve_app.client import Client

    with Client("http://127.0.0.1:9527") as client:
        client.translate(["Life is like a box of chocolates."], source="en", target="pt")
        # -> ["A vida é como uma caixa de chocolates."]
        client.embed(["The food was delicious."])          # -> [[0.01, ...384 floats]]
        client.predict("iris", [{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5,
                                 "petal_length_cm": 1.4, "petal_width_cm": 0.2}])
        # -> [{"species": "setosa", "confidence": 0.98, ...}]   (your own model, `models:`)

        # Jobs: submit now, collect later (POST /jobs; the future polls GET /jobs/<id>)
        job = client.submit_translation(many_texts, source="en", target="pt")
        job.job_id, job.status()                   # -> "queued" | "running" | ...
        job.result(timeout=600)                    # -> the translated texts; job.cancel() cancels it

    async with AsyncClient("http://127.0.0.1:9527") as client:
        await client.translate(...)
        job = await client.submit_embeddings(texts)
        vectors = await job                         # or await job.cancel()

Retries (serve_app/client/retry.py, on tenacity): a 503 (overloaded, shutting down, model
unavailable) is retried after the `Retry-After` the server sends (capped by `max_retry_wait_s`,
plus up to `jitter` of it at random, so that clients turned away together do not return
together), up to `max_retries` times and within `deadline_s` (120 s) for the whole call: each
attempt gets at most what remains of it. So are connection errors and timeouts. Nothing else is
retried: a 4xx is the caller's error and raises `ServeAppHTTPError` with the server's `error` and
`error_type`.
The model routes are idempotent, so retrying is safe. A job submission (`submit*()`) carries
a fresh `Idempotency-Key`, the same on each of its retries: a retry after a timeout whose first
attempt did reach the service returns that job, never a second one. Its timeout
(`submit_timeout_s`, 90 s) outlasts the service's own deadline (ingress.model_timeout_s, 60 s), so
the client does not give up on a submission the service is still accepting.

Inside the cluster, from another Serve deployment, skip HTTP and call the model
deployments through a handle (the same calls the ingress makes):

    from deployments.batching import Chunk
    translator = serve.get_deployment_handle("Translator", app_name="serve-app")
    texts, batch_size = await translator.translate.remote(Chunk("en", "pt", ["Hello."]))
    iris = serve.get_deployment_handle("Model.iris", app_name="serve-app")
    outputs, batch_size = await iris.predict.remote([{"sepal_length_cm": 5.1, ...}])

The package: `sync.py` (Client, JobFuture), `aio.py` (AsyncClient, AsyncJob), `retry.py`
(RetryPolicy), `wire.py` (request bodies, answers and errors, shared by both halves).
"""

from .aio import AsyncClient, AsyncJob
from .retry import RetryPolicy
from .sync import Client, JobFuture
from .wire import FINISHED_JOB_STATES, IDEMPOTENCY_HEADER, JobCancelled, ServeAppHTTPError

__all__ = ["AsyncClient", "AsyncJob", "Client", "FINISHED_JOB_STATES", "IDEMPOTENCY_HEADER", "JobCancelled",
           "JobFuture", "RetryPolicy", "ServeAppHTTPError"]
