"""Secure by default in a real Serve run (serve_app/auth.py, serve_app/admission.py):

1. listening on 0.0.0.0 with no API key, the app refuses to start (Serve reports why);
2. with keys from a file (as a mounted Secret gives them), on 0.0.0.0: one key flooding the
   service is shed (503 + Retry-After) while another key's requests still get through, measured
   against the same load sent with one key for both clients (what a shared pool would do);
3. the keys file rotated in place: the new key works and the old one stops, without a restart;
4. /readyz without a key says only each model's state.

Figures go to reports/chaos/figures.json (docs/security.md quotes them).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from serve_app.auth import KEYS_FILE_CHECK_INTERVAL_S

from .harness import ServeRun, serve_details, wait_for
from .helpers import post, translation_body

KEY_A = "4c1f9a7e2b8d6f3a0c5e9b1d7f4a2c8e6b0d3f5a"
KEY_B = "e8b2d6f0a4c9e1b7d3f5a2c8e6b0d4f9a1c7e3b5"
KEY_C = "0a9c7e5b3d1f8a6c4e2b9d7f5a3c1e8b6d4f2a0c"
#: more than ingress.max_inflight_requests (64): under one key the flood fills every slot
FLOOD_CLIENTS = 96
OTHER_CLIENTS = 2
PHASE_S = 20.0


async def _phase(url: str, flood_key: str, other_key: str) -> dict:
    """FLOOD_CLIENTS clients with `flood_key` sending without pause (a 503 is retried after 100 ms,
    not after Retry-After: a misbehaving client), and OTHER_CLIENTS with `other_key` sending one
    request after another, for PHASE_S seconds."""
    stop = time.monotonic() + PHASE_S
    outcomes: dict[str, list] = {"flood": [], "other": []}

    async def client(kind: str, key: str, n: int):
        async with httpx.AsyncClient(base_url=url, timeout=60, headers={"X-API-Key": key}) as http:
            i = 0
            while time.monotonic() < stop:
                o = await post(http, "/translation", translation_body(1, offset=n * 100_000 + i))
                outcomes[kind].append(o)
                i += 1
                if o.status == 503:
                    assert o.headers.get("retry-after"), o.body
                    await asyncio.sleep(0.1)

    await asyncio.gather(*(client("flood", flood_key, n) for n in range(FLOOD_CLIENTS)),
                         *(client("other", other_key, 1000 + n) for n in range(OTHER_CLIENTS)))

    def summary(found: list) -> dict:
        ok = sorted(o.seconds for o in found if o.status == 200)
        return {"requests": len(found), "ok": len(ok), "shed_503": sum(o.status == 503 for o in found),
                "other": sum(o.status not in (200, 503) for o in found),
                "ok_per_s": round(len(ok) / PHASE_S, 1),
                "p50_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
                "p95_ms": round(ok[int(0.95 * (len(ok) - 1))] * 1000, 1) if ok else None}

    return {kind: summary(found) for kind, found in outcomes.items()}


@pytest.mark.smoke  # CI: make chaos-smoke
def test_no_key_on_0_0_0_0_refuses_to_start(own_run, tmp_path, figures):
    run = ServeRun(tmp_path / "open", config="serve_config.placed.yaml")
    run.config["http_options"]["host"] = "0.0.0.0"
    run.env.pop("SERVE_APP_INGRESS_API_KEYS", None)
    run.env.pop("SERVE_APP_INGRESS_API_KEYS_FILE", None)
    try:
        run.start(wait_ready=False)

        def refused():
            try:
                app = serve_details(run)["applications"].get("serve-app")
            except (httpx.HTTPError, RuntimeError):
                return None
            if app and app["status"] == "DEPLOY_FAILED":
                return app["message"]
            return None

        message = wait_for(refused, 240, "the app to fail to deploy", interval_s=1)
        assert "Refusing to start" in message and "no API key" in message, message
        reason = next(line for line in message.splitlines() if "Refusing to start" in line)
        figures["security_refused_start"] = {"status": "DEPLOY_FAILED", "reason": reason[:400]}
    finally:
        run.stop()


@pytest.mark.smoke  # CI: make chaos-smoke
def test_fair_share_rotation_and_scrubbed_readyz(own_run, tmp_path, figures):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    run = ServeRun(tmp_path / "keyed", config="serve_config.placed.yaml",
                   env={"SERVE_APP_INGRESS_API_KEYS_FILE": str(keys)})
    run.config["http_options"]["host"] = "0.0.0.0"
    run.env.pop("SERVE_APP_INGRESS_API_KEYS", None)
    try:
        # /readyz answers without a key; the harness's wait_ready uses it.
        run.start()
        assert httpx.post(f"{run.url}/translation", json=translation_body(1), timeout=30).status_code == 401
        ready = httpx.get(f"{run.url}/readyz", timeout=30).json()
        assert set(ready["models"].values()) == {"ready"}, ready

        fair = asyncio.run(_phase(run.url, KEY_A, KEY_B))
        shared = asyncio.run(_phase(run.url, KEY_A, KEY_A))
        figures["security_fair_share"] = {
            "clients": {"flood": FLOOD_CLIENTS, "other": OTHER_CLIENTS}, "phase_s": PHASE_S,
            "max_inflight_requests": 64, "two_keys": fair, "one_key_for_both": shared}
        print(figures["security_fair_share"])
        # The flooding key is shed; the other key's requests all get through.
        assert fair["flood"]["shed_503"] > 0 and fair["flood"]["other"] == 0
        assert fair["other"]["ok"] > 0 and fair["other"]["shed_503"] == 0 and fair["other"]["other"] == 0
        # Control: the same load under one key sheds the light client too (what fairness prevents).
        assert shared["other"]["shed_503"] > 0

        # Rotation: the Secret's file replaced in place (B stays, A goes, C comes); no restart.
        rotated_at = time.monotonic()
        tmp = keys.with_suffix(".new")
        tmp.write_text(f"{KEY_B}\n{KEY_C}\n")
        tmp.replace(keys)

        def rotated():
            c = httpx.post(f"{run.url}/translation", json=translation_body(1), headers={"X-API-Key": KEY_C}, timeout=30)
            return c.status_code == 200
        wait_for(rotated, 30, "the new key to be accepted", interval_s=0.2)
        took = time.monotonic() - rotated_at
        # Each Ingress replica (the flood may have scaled them to 2) checks the file at most every
        # auth.KEYS_FILE_CHECK_INTERVAL_S after its own last check, so for up to one interval after the
        # rotation one replica may still take the old key while the other refuses it (two CI runs met
        # that, after a single 403). So: refused by 6 requests in a row (both replicas) within a few
        # intervals, then refused by every request that follows.
        def with_key(key: str) -> int:
            return httpx.post(f"{run.url}/translation", json=translation_body(1), headers={"X-API-Key": key},
                              timeout=30).status_code
        wait_for(lambda: all(with_key(KEY_A) == 403 for _ in range(6)), 3 * KEYS_FILE_CHECK_INTERVAL_S + 5,
                 "the old key refused by every replica", 0.2)
        refused_s = time.monotonic() - rotated_at
        old = [with_key(KEY_A) for _ in range(10)]
        assert old == [403] * 10, old
        assert with_key(KEY_B) == 200
        figures["security_key_rotation"] = {"new_key_accepted_after_s": round(took, 2),
                                            "old_key_refused_after_s": round(refused_s, 2), "old_key": old[0]}
    finally:
        run.stop()
