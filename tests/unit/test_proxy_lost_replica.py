"""What HAProxy answers for an Ingress replica that died holding a request (serve_app/proxy_shedding.py): the JSON
503 of a lost replica, never Ray's bare text 500. Against the stand-in replica of test_proxy_shedding.py."""

import httpx
import pytest

from tests.unit.test_proxy_shedding import haproxy_in_front  # noqa: F401 (the fixture)


@pytest.mark.parametrize("haproxy_in_front", [30.0], indirect=True)
def test_a_replica_that_dies_holding_a_request_gets_the_json_503_of_a_lost_replica_not_ray_s_bare_500(
        haproxy_in_front):
    """With no other replica to resend it to (HAProxy resent it to the same one, which died again), HAProxy's 502
    became Ray's text 500 "Internal Server Error", and so did Serve's fallback proxy's answer when the replica it
    waited for died: seen when a model placed in the Ingress crashed it. The Ingress's own JSON 500s pass."""
    url, replica, _ = haproxy_in_front
    lost = httpx.post(url + "/crash", json={}, headers={"X-Request-Id": "abc-3"}, timeout=30)
    assert lost.status_code == 503, lost.text
    assert lost.headers["retry-after"] == "3" and lost.headers["x-request-id"] == "abc-3"
    assert lost.json()["error_type"] == "model_unavailable" and "retry after 3 s" in lost.json()["error"]
    assert replica.posts() >= 2  # resent at least once first (retry-on empty-response)
    bare = httpx.post(url + "/bare-500", json={}, headers={"X-Request-Id": "abc-4"}, timeout=30)
    assert (bare.status_code, bare.json()["error_type"], bare.headers["x-request-id"]) == (
        503, "model_unavailable", "abc-4")
    own = httpx.post(url + "/json-500", json={}, timeout=30)
    assert own.status_code == 500 and own.json()["error_type"] == "model_crashed"
