"""What an OpenAI client meets (from a read-only review with the OpenAI Python SDK, 2026-11-30): `models.list()`
with the base URL docs/api.md gives (`GET /models`), `models.retrieve(id)`, the cards' `created` / `owned_by`, the
model name in any case, and text made of invisible characters only refused as blank."""

import pytest

from .fakes import install
from .test_http_edges import BODY


@pytest.fixture
def client(app_client):
    install()
    return app_client


def test_models_list_and_retrieve_answer_as_the_openai_sdk_asks(client):
    listed = client.get("/v1/models").json()
    assert client.get("/models").json() == listed  # OpenAI(base_url="http://host:9527") lists /models
    cards = {card["id"]: card for card in listed["data"]}
    assert all(card["object"] == "model" and card["owned_by"] == "serve-app" and isinstance(card["created"], int)
               for card in cards.values())
    for prefix in ("/v1/models/", "/models/"):
        for model_id, card in cards.items():
            assert client.get(prefix + model_id).json() == card
        missing = client.get(prefix + "no-such-model")
        assert missing.status_code == 404 and missing.json()["error_type"] == "model_not_found"
    assert client.get("/models/iris/predict").status_code == 405  # a custom model's route keeps its 405


def test_the_embedding_model_is_named_in_any_case(client):
    for name in ("all-MiniLM-L6-v2", "all-minilm-l6-v2", "All-MiniLM-L6-v2", "sentence-transformers/ALL-MINILM-L6-V2"):
        assert client.post("/v1/embeddings", json={"input": "hi", "model": name}).status_code == 200, name
    assert client.post("/v1/embeddings", json={"input": "hi", "model": "other"}).json()["error_type"] == \
        "unsupported_model"


@pytest.mark.parametrize("invisible", ["\u200b", "\ufeff", " \u2060 ", "\u200b\n\u200d"])
def test_text_of_invisible_characters_only_is_blank(client, invisible):
    """str.strip() keeps them and the tokenizer drops them: the model saw nothing and answered a meaningless vector
    (prompt_tokens 2) or translated an empty record."""
    embedded = client.post("/v1/embeddings", json={"input": ["fine", invisible]})
    assert embedded.status_code == 422 and "input[1] must not be empty" in embedded.json()["error"]
    record = {"id": "1", "text": invisible}
    translated = client.post("/translation", json={"payload": {**BODY["payload"], "records": [record]}})
    assert translated.status_code == 422 and "text must not be empty" in translated.json()["error"]
    assert client.post("/v1/embeddings", json={"input": "a\u200bb"}).status_code == 200  # visible text around it
