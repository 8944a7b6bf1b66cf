"""The ingress under an application `route_prefix`: Serve passes the full path (`/b/translation`) with the
prefix as `root_path` (`/b`); admission, the open paths and the metric labels read the path inside the app."""

import asyncio

import httpx

from serve_app import auth
from serve_app.api import app, set_service
from serve_app.auth import KeysFile
from serve_app.observability import route_label, route_path

from .fakes import FakeTranslator, install
from .test_api import body

PREFIX = "/b"


def _send(requests):
    async def scenario():
        transport = httpx.ASGITransport(app=app, root_path=PREFIX)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await asyncio.gather(*(client.request(method, PREFIX + path, **kw) for method, path, kw in requests))
    try:
        return asyncio.run(scenario())
    finally:
        set_service(None)


def test_the_path_inside_the_app():
    assert route_path({"path": "/b/translation", "root_path": "/b"}) == "/translation"
    assert route_path({"path": "/b", "root_path": "/b"}) == "/"
    assert route_path({"path": "/bc/translation", "root_path": "/b"}) == "/bc/translation"  # not under it
    assert route_path({"path": "/translation", "root_path": ""}) == "/translation"
    assert route_label(route_path({"path": "/b/models/iris/predict", "root_path": "/b"})) == "/models/{name}/predict"
    # the jobs API has labels of its own (it was "other", with unknown paths' 404s), one for every job id
    assert [route_label(p) for p in ("/jobs", "/jobs/0f3a", "/jobs/0f3a/x", "/nope")] == [
        "/jobs", "/jobs/{id}", "other", "other"]


def test_admission_governs_the_model_routes_under_a_prefix():
    translator, _ = install(FakeTranslator(delay_s=0.3), ingress={"max_inflight_requests": 1})
    translation = ("POST", "/translation", {"json": body([{"id": "1", "text": "hi"}])})
    responses = _send([translation] * 3)
    assert sorted(r.status_code for r in responses) == [200, 503, 503]
    assert translator.max_in_flight == 1


def test_the_open_paths_stay_open_under_a_prefix(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text("a3f1c9e07b2d4f6a8c0e1b3d5f7a9c2e\n")
    monkeypatch.setattr(auth, "_FILES", {str(path): KeysFile(str(path), interval_s=0)})
    install(ingress={"api_keys_file": str(path)})
    healthz, translation = _send([("GET", "/healthz", {}),
                                  ("POST", "/translation", {"json": body([{"id": "1", "text": "hi"}])})])
    assert healthz.status_code == 200
    assert translation.status_code == 401  # a model route still needs its key
