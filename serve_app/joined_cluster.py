"""`make run` on a Ray cluster it joined (serve_app/run.py, --address host:port): what it may deploy there, and what
its stop removes. A Serve config is the whole set of applications: deploying one deletes every application it does
not name and replaces those it names, so the launcher deploys only onto a cluster that serves none of either (or, told
to, the config's own names), and its stop deletes the config's applications, never `serve.shutdown` (everyone's)."""

from __future__ import annotations

from typing import Callable, Optional


def refusal(app_names: list[str], replace: bool = False) -> Optional[str]:
    """Why the config may not be deployed on the joined cluster, or None. Refused: applications the config does not
    name (deploying would delete them), and, unless `replace`, applications of its names: a RayService's
    `serve-app`, or a launcher's killed before its stop; deploying replaces them and the stop deletes them."""
    from ray import serve

    served = set(serve.status().applications)
    if others := sorted(served - set(app_names)):
        return (f"the cluster already serves {', '.join(others)}, which deploying this config would delete (a Serve "
                "config is the whole set of applications): serve them together")
    if (same := sorted(served & set(app_names))) and not replace:
        return (f"the cluster already serves {', '.join(same)}, of this config's names (a RayService's, or left by a "
                "launcher killed before its stop): this run would replace it and delete it when it stops. If it is "
                "yours to replace: SERVE_APP_REPLACE=1 make run (or --replace)")
    return None


def stop_serve(joining: bool, app_names: list[str], say: Callable[[str], None]) -> None:
    """Serve stopped as far as it is this launcher's: all of it on its own Ray instance; on a joined cluster only
    the config's applications (serve.shutdown would delete every application there, other users' too)."""
    from ray import serve

    if not joining:
        return serve.shutdown()
    for name in app_names:  # each on its own: one that times out does not keep the others deployed
        try:
            serve.delete(name)
        except Exception as exc:  # noqa: BLE001 - reported; the next one is still deleted
            say(f"serve-app: could not delete application {name!r}: {exc!r}")
