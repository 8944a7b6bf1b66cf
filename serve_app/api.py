"""The FastAPI app: thin routes over `Service`. No Ray imports here.

Routes live at module level and reach the service through `Depends(get_service)`,
so unit tests drive this app with FastAPI's TestClient and fake model clients,
while Serve mounts the very same app behind `@serve.ingress`.
"""

from __future__ import annotations

from typing import Optional

from fastapi import Depends, FastAPI, Response
from fastapi.responses import JSONResponse

from . import __version__
from .errors import NotReady, install_error_handlers
from .middleware import AdmissionControl, BodySizeLimit
from .schemas import (
    ERROR_RESPONSES, EmbeddingsRequest, EmbeddingsResponse, HealthResponse, ModelCard, ModelsResponse,
    TranslationRequest, TranslationResponse,
)
from .service import Service
from .settings import IngressSettings

#: response header: records in the largest model batch this request's records rode in
BATCH_HEADER = "X-Batch-Records"


# The service lives in this module, not in `app.state`: Serve pickles the app
# object into the replica, while functions (these routes) are pickled by
# reference and so see this module's globals in the replica process.
_service: Optional[Service] = None


def set_service(service: Optional[Service]) -> None:
    """Install the service the routes use (the Serve ingress does this at start-up)."""
    global _service
    _service = service


def get_service() -> Service:
    if _service is None:
        raise NotReady("The service is starting.", retry_after_s=2)
    return _service


def create_app() -> FastAPI:
    app = FastAPI(
        title="serve-app",
        version=__version__,
        description="Translation and embeddings, batched and autoscaled on Ray Serve.",
    )
    install_error_handlers(app)

    def limits() -> IngressSettings:
        return _service.limits if _service else IngressSettings()

    # Starlette runs the last added middleware first: shed before reading bodies.
    app.add_middleware(BodySizeLimit, get_limit=lambda: limits().max_body_bytes)
    app.add_middleware(AdmissionControl, limit=lambda: limits().max_inflight_requests,
                       retry_after_s=lambda: limits().retry_after_s)

    @app.post("/translation", response_model=TranslationResponse, responses=ERROR_RESPONSES)
    async def translation(body: TranslationRequest, response: Response, service: Service = Depends(get_service)):
        """Translate records from `fromLang` to `toLang`; answers keep the records' order and ids."""
        result, batch = await service.translate(body.payload)
        response.headers[BATCH_HEADER] = str(batch)
        return result

    @app.post("/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES)
    @app.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES,
              include_in_schema=False)
    async def embeddings(body: EmbeddingsRequest, response: Response, service: Service = Depends(get_service)):
        """OpenAI-compatible embeddings: unit-length mean-pooled MiniLM vectors."""
        result, batch = await service.embed(body)
        response.headers[BATCH_HEADER] = str(batch)
        return result

    @app.get("/healthz", response_model=HealthResponse)
    async def healthz():
        """The ingress process is alive (says nothing about the models)."""
        return HealthResponse(status="ok")

    @app.get("/readyz", response_model=HealthResponse, responses={503: ERROR_RESPONSES[503]})
    async def readyz(service: Service = Depends(get_service)):
        """200 only when every model deployment has loaded and warmed up its model."""
        states = await service.readiness()
        if all(s == "ready" for s in states.values()):
            return HealthResponse(status="ready", models=states)
        return JSONResponse(
            status_code=503,
            headers={"Retry-After": "2"},
            content={"error": "Not every model is ready.", "error_type": "not_ready", "models": states},
        )

    @app.get("/v1/models", response_model=ModelsResponse)
    async def models(service: Service = Depends(get_service)):
        """Each served model: backend, languages or dimensions, batch settings."""
        return ModelsResponse(data=[ModelCard(**card) for card in await service.models()])

    return app


app = create_app()
