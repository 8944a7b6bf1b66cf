"""Serve's own floor: the smallest app with serve-app's shape, for `bench.overhead`.

A FastAPI ingress (POST /translation, GET /readyz) calls a model deployment that
returns the texts unchanged, through a DeploymentHandle, one call per request: the
proxy -> ingress -> handle -> replica path every serve-app request takes, with none
of serve-app's code (no middlewares, no pydantic schemas, no batching, no model).
Its CPU per request is what Serve costs on this machine whatever the app does.

    serve run bench.floor_app:app     # or through `python -m bench.overhead --variant floor:app=floor`
"""

# No `from __future__ import annotations`: FastAPI must see `Request` itself, not the string
# "Request" (it would take it for a required query parameter and answer 422).
from fastapi import FastAPI, Request
from ray import serve
from ray.serve.handle import DeploymentHandle

api = FastAPI()


@serve.deployment(name="Echo", max_ongoing_requests=128, ray_actor_options={"num_cpus": 0.4})
class Echo:
    async def translate(self, texts: list) -> list:
        return texts


@serve.deployment(name="Ingress", max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0.1})
@serve.ingress(api)
class FloorIngress:
    def __init__(self, echo: DeploymentHandle):
        self.echo = echo.options(method_name="translate")

    @api.post("/translation")
    async def translation(self, request: Request) -> dict:
        records = (await request.json())["payload"]["records"]
        texts = await self.echo.remote([r["text"] for r in records])
        return {"result": [{"id": r["id"], "text": t} for r, t in zip(records, texts)]}

    @api.get("/readyz")
    async def readyz(self) -> dict:
        return {"status": "ready"}

    async def drain(self, timeout_s: float = 30.0) -> dict:
        """`serve_app.run` drains every app's Ingress on stop; there is nothing to wait for here."""
        return {}


app = FloorIngress.bind(Echo.bind())
