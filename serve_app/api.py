"""The FastAPI app: thin routes over `Service`. No Ray imports here.

Routes live at module level and reach the service through `Depends(get_service)`,
so unit tests drive this app with FastAPI's TestClient and fake model clients,
while Serve mounts the very same app behind `@serve.ingress`.
"""

from __future__ import annotations

import re
from typing import Optional

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from . import __version__
from .cache import cache_directives
from .jobs.api import IDEMPOTENCY_HEADER, _IDEMPOTENCY_DESCRIPTION, _PAGE_DESCRIPTION, job_owner
from .errors import ERROR_TYPE_SCOPE_KEY, ModelNotFound, NotReady, install_error_handlers
from . import auth, middleware
from .middleware import AdmissionControl, ApiKeyAuth, BodySizeLimit, LazyCORS, RequestObserver, request_id_of
from .observability import RECORDS_SCOPE_KEY, RequestRecorder
from .schemas import (
    ERROR_RESPONSES, JOB_RESPONSES, JOB_SUBMIT_RESPONSES, PREDICT_ERROR_RESPONSES, EmbeddingsRequest,
    EmbeddingsResponse, HealthResponse, JobRequest, JobResponse, ModelCard, ModelsResponse, PredictRequest,
    PredictResponse, TranslationRequest, TranslationResponse,
)
from .service import Computed, Service
from .settings import IngressSettings

#: response header: records in the largest model batch this request's records rode in
#: (0 when none was computed: every record came from the response cache); only while the service has
#: one tenant (keys off, or one key): with several it would tell one key how much the others send
BATCH_HEADER = "X-Batch-Records"

#: response header: `hit` (every text answered from the response cache), `miss` or `partial`;
#: absent when the cache is off
CACHE_HEADER = "X-Cache"

_CACHE_CONTROL_DESCRIPTION = (
    "`no-cache`: compute every text even when the response cache holds it (the fresh answer is "
    "stored); `no-store`: do not store this request's answers."
)


def _set_batch_header(response: Response, records: int) -> None:
    if len(auth.configured_keys(current_limits()).entries) <= 1:
        response.headers[BATCH_HEADER] = str(records)


def _set_computed_headers(response: Response, computed: Computed) -> None:
    _set_batch_header(response, computed.batch_records)
    if computed.cache is not None:
        response.headers[CACHE_HEADER] = computed.cache


#: request header: the client's deadline in milliseconds, capped by `ingress.model_timeout_s`
TIMEOUT_HEADER = "X-Request-Timeout-Ms"
#: the largest deadline the header takes (a year; any deadline past `model_timeout_s` is capped to it, not refused)
MAX_TIMEOUT_MS = 365 * 24 * 3600 * 1000

#: every request is counted and logged here (tests read its tallies)
recorder = RequestRecorder()


def _deadline_s(timeout_ms: Optional[int]) -> Optional[float]:
    return None if timeout_ms is None else timeout_ms / 1000.0


_TIMEOUT_DESCRIPTION = (
    "Deadline for this request in milliseconds; the server caps it at its own `model_timeout_s`. "
    "A request that cannot finish in time is answered 504 and its queued records are dropped."
)


# The service lives in this module, not in `app.state`: Serve pickles the app
# object into the replica, while functions (these routes) are pickled by
# reference and so see this module's globals in the replica process.
_service: Optional[Service] = None


def set_service(service: Optional[Service]) -> None:
    """Install the service the routes use (the Serve ingress does this at start-up)."""
    global _service
    _service = service


_DEFAULT_LIMITS: Optional[IngressSettings] = None


def current_limits() -> IngressSettings:
    """The running service's ingress settings (defaults before start-up).

    Module-level on purpose: Serve pickles the app, and closures inside
    `create_app` are pickled *by value* with a snapshot of this module's globals
    (where `_service` is still None); module-level functions are pickled by
    reference, so the middlewares see the service installed in the replica.
    """
    global _DEFAULT_LIMITS
    if _service is not None:
        return _service.limits
    if _DEFAULT_LIMITS is None:
        _DEFAULT_LIMITS = IngressSettings()
    return _DEFAULT_LIMITS


async def get_service() -> Service:
    # async on purpose: FastAPI runs a plain `def` dependency in a worker thread, a thread
    # hop (and GIL hand-off) on every request for what is a global lookup.
    if _service is None:
        raise NotReady("The service is starting.", retry_after_s=2)
    return _service


def _shows_details(scope) -> bool:
    """Whether this caller may read why a model is not ready (Serve's messages carry file paths
    and exception texts): a caller with a valid key, or anyone while keys are off on a loopback
    service (`make run`). With `auth_disabled` (a cluster behind an authenticating proxy) nobody:
    the reasons are in the Ingress's log."""
    if middleware.api_key_id_of(scope) is not None:
        return True
    limits = current_limits()
    return not limits.auth_disabled and not auth.configured_keys(limits)


def public_state(state: str) -> str:
    """A readiness state without its reason: `failed: DEPLOY_FAILED: ... /models/x` -> `failed`."""
    return re.split(r"[:( ]", state, maxsplit=1)[0]


def create_app() -> FastAPI:
    app = FastAPI(
        title="serve-app",
        version=__version__,
        description="Translation and embeddings, batched and autoscaled on Ray Serve.",
    )
    install_error_handlers(app)

    # Starlette runs the last added middleware first. Outermost to innermost: observe (log and
    # count every answer), CORS (preflights), API key, shed load, then bound the body before parsing.
    app.add_middleware(BodySizeLimit, get_limit=lambda: current_limits().max_body_bytes,
                       get_timeout_s=lambda: current_limits().body_timeout_s)
    # Admission shares the in-flight slots fairly between API keys (serve_app/admission.py).
    app.add_middleware(AdmissionControl, limit=lambda: current_limits().max_inflight_requests,
                       retry_after_s=lambda: current_limits().retry_after_s, key_of=middleware.api_key_id_of,
                       configured_keys=lambda: len(auth.configured_keys(current_limits())),
                       max_waiting=lambda: current_limits().max_waiting_requests,
                       max_wait_s=lambda: current_limits().max_wait_s)
    app.add_middleware(ApiKeyAuth, keys=lambda: auth.configured_keys(current_limits()))
    app.add_middleware(LazyCORS, origins=lambda: current_limits().cors_origins)
    app.add_middleware(RequestObserver, recorder=recorder, enabled=lambda: current_limits().access_log)

    @app.post("/translation", response_model=TranslationResponse, responses=ERROR_RESPONSES)
    async def translation(
        body: TranslationRequest, request: Request, response: Response,
        timeout_ms: Optional[int] = Header(None, alias=TIMEOUT_HEADER, ge=1, le=MAX_TIMEOUT_MS,
                                           description=_TIMEOUT_DESCRIPTION),
        cache_control: Optional[list[str]] = Header(None, description=_CACHE_CONTROL_DESCRIPTION),
        service: Service = Depends(get_service),
    ):
        """Translate records from `fromLang` to `toLang`; answers keep the records' order and ids."""
        request.scope[RECORDS_SCOPE_KEY] = len(body.payload.records)
        read, write = cache_directives(cache_control)
        result, computed = await service.translate(body.payload, timeout_s=_deadline_s(timeout_ms),
                                                   read_cache=read, write_cache=write)
        _set_computed_headers(response, computed)
        return result

    @app.post("/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES)
    @app.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES,
              include_in_schema=False)
    async def embeddings(
        body: EmbeddingsRequest, request: Request, response: Response,
        timeout_ms: Optional[int] = Header(None, alias=TIMEOUT_HEADER, ge=1, le=MAX_TIMEOUT_MS,
                                           description=_TIMEOUT_DESCRIPTION),
        cache_control: Optional[list[str]] = Header(None, description=_CACHE_CONTROL_DESCRIPTION),
        service: Service = Depends(get_service),
    ):
        """OpenAI-compatible embeddings: unit-length mean-pooled MiniLM vectors."""
        request.scope[RECORDS_SCOPE_KEY] = len(body.texts())
        read, write = cache_directives(cache_control)
        result, computed = await service.embed(body, timeout_s=_deadline_s(timeout_ms),
                                               read_cache=read, write_cache=write)
        _set_computed_headers(response, computed)
        return result

    @app.post("/models/{name}/predict", response_model=PredictResponse, responses=PREDICT_ERROR_RESPONSES)
    async def predict(
        name: str, body: PredictRequest, request: Request, response: Response,
        timeout_ms: Optional[int] = Header(None, alias=TIMEOUT_HEADER, ge=1, le=MAX_TIMEOUT_MS,
                                           description=_TIMEOUT_DESCRIPTION),
        service: Service = Depends(get_service),
    ):
        """Run your own model (an entry of `models:`, docs/your-own-model.md) on `inputs`, each matching
        the model's `Input` schema (listed in /v1/models); outputs keep the inputs' order."""
        request.scope[RECORDS_SCOPE_KEY] = len(body.inputs)
        result, batch = await service.predict(name, body.inputs, timeout_s=_deadline_s(timeout_ms))
        _set_batch_header(response, batch)
        return result

    @app.post("/jobs", status_code=202, response_model=JobResponse, responses=JOB_SUBMIT_RESPONSES)
    async def submit_job(body: JobRequest, request: Request, response: Response,
                         idempotency_key: Optional[str] = Header(None, alias=IDEMPOTENCY_HEADER, min_length=1,
                                                                 max_length=255, description=_IDEMPOTENCY_DESCRIPTION),
                         service: Service = Depends(get_service)):
        """Compute a translation, embeddings or custom-model request in the background: 202 with the
        job's id at once (`Location: /jobs/<id>`); poll GET /jobs/<id> for its state and result.
        The payload is validated now, so a bad one gets the 4xx its route would answer. Job records
        queue behind interactive requests in the model replicas. Jobs are kept in the job store
        (docs/jobs.md) and only the API key that submitted one can read or cancel it."""
        view = await service.submit_job(body.task, body.payload, request_id_of(request.scope),
                                        job_owner(request.scope), idempotency_key)
        response.headers["Location"] = f"{request.scope.get('root_path', '')}/jobs/{view['job_id']}"
        return view

    @app.get("/jobs/{job_id}", response_model=JobResponse, responses=JOB_RESPONSES)
    async def get_job(job_id: str, request: Request,
                      offset: Optional[int] = Query(None, ge=0, description=_PAGE_DESCRIPTION),
                      limit: Optional[int] = Query(None, ge=1, description="Records in this page (capped)."),
                      service: Service = Depends(get_service)):
        """The job's state (`queued`, `running`, `succeeded`, `failed`, `cancelled`), its progress,
        and once it succeeded its result: exactly what its route would have answered (a large one
        a page at a time: `page.next`)."""
        view = await service.job(job_id, job_owner(request.scope), offset, limit)
        if view.get("page") is None:
            view.pop("page", None)  # a whole result: the response as it always was
            return view
        if view["page"].get("next"):  # under the application's route prefix, as Location is
            view["page"]["next"] = request.scope.get("root_path", "") + view["page"]["next"]
        return JSONResponse(view)  # a page (bounded by jobs.max_page_bytes), not re-validated

    @app.delete("/jobs/{job_id}", response_model=JobResponse, responses=JOB_RESPONSES)
    async def cancel_job(job_id: str, request: Request, service: Service = Depends(get_service)):
        """Cancel a queued or running job: its records not yet computing are never computed.
        A job that already finished is 409."""
        return await service.cancel_job(job_id, job_owner(request.scope))

    @app.get("/healthz", response_model=HealthResponse)
    @app.head("/healthz", include_in_schema=False)  # (uptime checks that send HEAD)
    async def healthz():
        """The ingress process is alive (says nothing about the models)."""
        return HealthResponse(status="ok")

    @app.get("/readyz", response_model=HealthResponse, responses={503: ERROR_RESPONSES[503]})
    @app.head("/readyz", include_in_schema=False)
    async def readyz(request: Request, service: Service = Depends(get_service)):
        """200 only when every model deployment has loaded and warmed up its model (also when its
        replicas are all busy: `ready (busy: ...)`); 503 with each model's state otherwise
        (`failed: ...` quotes Serve's reason when a deployment failed)."""
        states = await service.readiness()
        if not _shows_details(request.scope):
            states = {name: public_state(state) for name, state in states.items()}
        if middleware.DRAIN.draining:  # via the module: this route is pickled by value
            states = {name: "draining (the service is stopping)" for name in states}
        if all(public_state(s) == "ready" for s in states.values()):  # `ready (busy: ...)` too
            return HealthResponse(status="ready", models=states)
        failed = any(s.startswith("failed") for s in states.values())
        request.scope[ERROR_TYPE_SCOPE_KEY] = "not_ready"
        return JSONResponse(
            status_code=503,
            headers={"Retry-After": "2"},
            content={"error": "A model deployment failed to start." if failed else "Not every model is ready.",
                     "error_type": "not_ready", "models": states},
        )

    @app.get("/v1/models", response_model=ModelsResponse,
             responses={k: ERROR_RESPONSES[k] for k in (401, 403, 503, 504)})
    @app.get("/models", response_model=ModelsResponse, include_in_schema=False)  # OpenAI(base_url=<no /v1>)
    async def models(service: Service = Depends(get_service)):
        """Each served model: backend, languages or dimensions, batch settings."""
        return ModelsResponse(data=[ModelCard(**card) for card in await service.models()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard,
             responses={k: PREDICT_ERROR_RESPONSES[k] for k in (401, 403, 404, 503, 504)})
    @app.get("/models/{model_id}", response_model=ModelCard, include_in_schema=False)
    async def model(model_id: str, service: Service = Depends(get_service)):
        """One served model's card, as listed in /v1/models (OpenAI's `models.retrieve`)."""
        cards = await service.models()
        for card in cards:
            if card["id"] == model_id:
                return ModelCard(**card)
        raise ModelNotFound(f"No model named {model_id!r} is served here; models: {[c['id'] for c in cards]!r}.")

    return app


app = create_app()
