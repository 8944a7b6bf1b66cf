"""Ray's and Serve's view of the local cluster, read from the head's dashboard REST API as
`ray status` / `serve status` and the KubeRay operator read it."""

from __future__ import annotations

import time
from typing import Callable, Optional

import httpx


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5,
          errors: tuple[type[BaseException], ...] = (Exception,)):
    """Poll `condition` until truthy; an exception in `errors` (a probe that cannot connect yet)
    counts as "not yet", any other ends the wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
        except errors:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)



class DashboardView:
    """Mixed into LocalCluster: needs `dashboard_url`, `ray_auth_headers()` and `spec.serve_config`."""

    dashboard_url: str
    spec: object

    def ray_auth_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def ray_nodes(self) -> list[dict]:
        r = httpx.get(f"{self.dashboard_url}/nodes?view=summary", timeout=5, headers=self.ray_auth_headers())
        r.raise_for_status()
        return r.json()["data"]["summary"]

    def youngest_alive_raylets(self) -> dict[str, int]:
        """{node address: start time in ms since the epoch} of the youngest ALIVE raylet at each address
        (a lost node's entry can stay ALIVE in the dashboard's view beside its successor's)."""
        youngest: dict[str, int] = {}
        for node in self.ray_nodes():
            raylet = node["raylet"]
            if raylet.get("state") == "ALIVE":
                address = raylet["nodeManagerAddress"]
                youngest[address] = max(youngest.get(address, 0), int(raylet.get("startTimeMs") or 0))
        return youngest

    def submit_serve(self, config: Optional[dict] = None) -> None:
        """PUT the Serve config to the head's dashboard, as the operator does with serveConfigV2."""
        r = httpx.put(f"{self.dashboard_url}/api/serve/applications/", json=config or self.spec.serve_config,
                      timeout=60, headers=self.ray_auth_headers())
        if r.status_code >= 400:
            raise RuntimeError(f"dashboard refused the Serve config: {r.status_code} {r.text[:2000]}")

    def serve_details(self) -> dict:
        r = httpx.get(f"{self.dashboard_url}/api/serve/applications/", timeout=10, headers=self.ray_auth_headers())
        r.raise_for_status()
        return r.json()

    def applications_running(self) -> bool:
        try:
            apps = self.serve_details().get("applications") or {}
        except httpx.HTTPError:  # the head is down or restarting
            return False
        return bool(apps) and all(a.get("status") == "RUNNING" for a in apps.values())

    def wait_running(self, timeout_s: float = 300) -> float:
        start = time.monotonic()
        wait_until(self.applications_running, timeout_s, "every Serve application RUNNING", 1.0)
        return time.monotonic() - start
