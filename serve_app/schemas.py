"""Request and response bodies of the HTTP API.

`/translation` keeps the exact contract existing clients use:
`{"payload": {"fromLang", "toLang", "records": [{"id", "text"}]}}` ->
`{"result": [{"id", "text"}]}`, same order and ids. `/embeddings` follows
OpenAI's embeddings API. Unknown extra fields are ignored (clients may send
their own metadata); missing or mistyped fields are 422.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

_LANG_PATTERN = r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$"


#: C0/C1 control characters other than tab, newline and carriage return (NUL included)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
#: lone UTF-16 surrogates: JSON can carry them (`"\\ud800"`), UTF-8 cannot, and native models crash on them
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """What a model may see: control characters become spaces, lone surrogates U+FFFD.

    Everything else (any script, emoji, combining marks) passes unchanged."""
    text = _SURROGATE.sub("\ufffd", text)
    return _CONTROL.sub(" ", text)


def is_blank(text: str) -> bool:
    """Nothing a model could read: empty, whitespace, or invisible format characters only (zero-width space,
    byte-order mark, word joiner: Unicode's Cf), which str.strip() keeps and a tokenizer drops."""
    return all(char.isspace() or unicodedata.category(char) == "Cf" for char in text)


def _valid_id(value: str) -> str:
    if _SURROGATE.search(value):
        raise ValueError("id must be valid Unicode (it holds a lone surrogate)")
    return value


def normalise_language(code: str) -> str:
    """`EN`, `pt_BR`, `pt-br` -> `en`, `pt-br`: lower case, `-` separator."""
    return code.strip().lower().replace("_", "-")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)


class TranslationRecord(_Body):
    id: StrictStr = Field(..., description="Opaque id, echoed back unchanged.", examples=["123"])
    text: StrictStr = Field(..., description="Text to translate; must not be blank.",
                            examples=["Life is like a box of chocolates."])

    @field_validator("id")
    @classmethod
    def _id_is_unicode(cls, value: str) -> str:
        return _valid_id(value)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        value = clean_text(value)
        if is_blank(value):
            raise ValueError("text must not be empty, whitespace, control or invisible characters only")
        return value


class TranslationPayload(_Body):
    fromLang: StrictStr = Field(..., pattern=_LANG_PATTERN, examples=["en"],
                                description="Source language: a BCP 47 tag (e.g. `en`, `pt-BR`, `zh-Hant`).")
    toLang: StrictStr = Field(..., pattern=_LANG_PATTERN, examples=["pt"],
                              description="Target language: a BCP 47 tag (e.g. `pt`, `en-US`, `zh-Hant`).")
    records: list[TranslationRecord] = Field(..., min_length=1, description="Records to translate, in order.")


class TranslationRequest(_Body):
    payload: TranslationPayload

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"payload": {"fromLang": "en", "toLang": "pt",
                             "records": [{"id": "123", "text": "Life is like a box of chocolates."}]}}
            ]
        },
    )


class TranslatedRecord(BaseModel):
    id: str
    text: str


class TranslationResponse(BaseModel):
    result: list[TranslatedRecord]


class EmbeddingsRequest(_Body):
    input: Union[StrictStr, list[StrictStr]] = Field(
        ..., description="A text or a list of texts (token arrays are not supported).",
        examples=["The food was delicious."],
    )
    model: Optional[StrictStr] = Field(None, description="Optional; must name the served model when given.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`float` lists, or `base64` of little-endian float32 as OpenAI sends."
    )
    user: Optional[StrictStr] = None
    dimensions: Optional[StrictInt] = Field(
        None, ge=1, description="Optional; must equal the served model's dimensions (vectors are not shortened).")

    @field_validator("input", mode="before")
    @classmethod
    def _no_token_arrays(cls, value):
        """OpenAI also takes token ids (a list of ints, or of lists of ints): refused in words, not with an error
        for each branch of the union."""
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, int) or (isinstance(item, list) and item and isinstance(item[0], int))
               for item in items):
            raise ValueError("token arrays are not supported: send the text itself (a string or a list of strings)")
        return value

    @field_validator("input")
    @classmethod
    def _inputs_not_blank(cls, value: Union[str, list[str]]) -> Union[str, list[str]]:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must hold at least one text")
        items = [clean_text(text) for text in items]
        for i, text in enumerate(items):
            if is_blank(text):
                raise ValueError(f"input[{i}] must not be empty, whitespace, control or invisible characters only")
        return items[0] if isinstance(value, str) else items

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class PredictRequest(_Body):
    inputs: list[dict[str, Any]] = Field(
        ..., min_length=1,
        description="Items for the model, each an object matching its `Input` schema (see /v1/models).",
        examples=[[{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5, "petal_length_cm": 1.4, "petal_width_cm": 0.2}]],
    )


class PredictResponse(BaseModel):
    model: str = Field(..., description="The model's name, as in the URL.")
    outputs: list[dict[str, Any]] = Field(
        ..., description="One object per input, in the inputs' order, matching the model's `Output` schema.")


class JobRequest(_Body):
    """`POST /jobs`: a request to compute in the background."""

    task: StrictStr = Field(
        ..., min_length=1,
        description="`translation`, `embeddings`, or the name of a custom model (see /v1/models).",
        examples=["translation"],
    )
    payload: dict[str, Any] = Field(
        ..., description="What the task's route takes: for `translation` the `payload` object of /translation "
        "(fromLang, toLang, records); for `embeddings` the /embeddings body (input, ...); for a custom model "
        "the body of /models/<name>/predict (inputs).",
        examples=[{"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "Good morning."}]}],
    )


class JobProgress(BaseModel):
    records_done: int = Field(..., description="Records (or inputs) computed so far.")
    records_total: int


class JobError(BaseModel):
    error: str
    error_type: str


class JobResponse(BaseModel):
    job_id: str
    task: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    created_at: str = Field(..., description="ISO 8601, UTC.")
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    expires_at: Optional[str] = Field(
        None, description="When a finished job is forgotten (then GET is 404); see jobs.result_ttl_s.")
    progress: JobProgress
    result: Optional[dict[str, Any]] = Field(
        None, description="Once `succeeded`: exactly what the task's route would have answered.")
    error: Optional[JobError] = Field(None, description="Once `failed`: the error the route would have answered.")


class ErrorResponse(BaseModel):
    error: str = Field(..., description="A sentence for a person.")
    error_type: str = Field(..., description="A stable snake_case code for programs.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(0, description="OpenAI's field; not tracked here.")
    owned_by: str = "serve-app"
    task: Literal["translation", "embeddings", "prediction"]
    deployment: str
    placement: Literal["deployment", "ingress"] = Field(
        "deployment", description="`deployment`: the model runs in its own deployment (named in `deployment`); "
        "`ingress`: inside each Ingress replica (settings `<section>.placement`).")
    backend: str
    language_pairs: Optional[list[str]] = None
    dimensions: Optional[int] = None
    input_schema: Optional[dict[str, Any]] = Field(
        None, description="For `prediction` models: JSON schema of one item of `inputs`.")
    output_schema: Optional[dict[str, Any]] = Field(
        None, description="For `prediction` models: JSON schema of one item of `outputs`.")
    batching: dict[str, Any]
    details: dict[str, Any] = Field(default_factory=dict)


class ModelsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthResponse(BaseModel):
    status: str
    models: dict[str, str] = Field(default_factory=dict)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Unsupported language pair or model."},
    401: {"model": ErrorResponse, "description": "API keys are configured and the request sent none."},
    403: {"model": ErrorResponse, "description": "The API key sent is not valid."},
    413: {"model": ErrorResponse, "description": "Too many records or a text longer than the limit."},
    422: {"model": ErrorResponse, "description": "The body does not match the schema."},
    503: {"model": ErrorResponse, "description": "Overloaded or model unavailable; see Retry-After."},
    504: {"model": ErrorResponse, "description": "The request did not finish within its deadline."},
}

#: the error answers of `POST /models/{name}/predict`: the common ones and 404 for an unknown name
PREDICT_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    404: {"model": ErrorResponse, "description": "No model of that name is served (`model_not_found`)."},
}

JOB_SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    400: {"model": ErrorResponse, "description": "Unknown task, unsupported language pair or model."},
    404: {"model": ErrorResponse, "description": "Jobs are off, or the custom model does not exist."},
    503: {"model": ErrorResponse, "description": "Too many unfinished jobs (jobs.max_unfinished_jobs), "
                                                 "or shutting down; see Retry-After."},
}

JOB_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such job: it never existed or its result expired."},
    409: {"model": ErrorResponse, "description": "DELETE of a job that already finished."},
    **{k: ERROR_RESPONSES[k] for k in (401, 403, 503, 504)},
}
