"""k8s/base/grafana-dashboard.json against the metrics the code defines: every serve-app series a panel queries
exists (as Ray exports it: `ray_` + the name, histograms as _bucket/_sum/_count), the model metrics are grouped by
their `model` tag (Serve's `deployment` label is the hosting replica's: `Ingress` for every placed model), and no
mean comes from a histogram's _sum (Ray exports it from bucket midpoints: a batch of 1 counted 0.5)."""

from __future__ import annotations

import json
import re

from .helpers import ROOT

DASHBOARD = ROOT / "k8s" / "base" / "grafana-dashboard.json"
#: instruments tagged `model` (deployments/metrics.py, deployments/continuous_translation.py)
MODEL_TAGGED = ("deployments/metrics.py", "deployments/continuous_translation.py")


def _defined(paths) -> set[str]:
    names = set()
    for path in paths:
        names |= set(re.findall(r'"(serve_app_[a-z_]+)"', path.read_text()))
    return names


def _queries() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def test_every_serve_app_series_on_the_dashboard_is_defined_and_grouped_by_its_own_tags():
    defined = _defined([*(ROOT / "serve_app").rglob("*.py"), *(ROOT / "deployments").rglob("*.py")])
    model_tagged = _defined(ROOT / p for p in MODEL_TAGGED)
    queried = set()
    for expr in _queries():
        for name, suffix in re.findall(r"ray_(serve_app_[a-z_]+?)(_bucket|_sum|_count)?\{", expr):
            assert name in defined, f"{name} is not a metric the code defines: {expr}"
            queried.add(name)
            if name in model_tagged:
                assert "by (deployment)" not in expr and "by (le, deployment)" not in expr, expr
            assert suffix != "_sum", f"a histogram's _sum is approximate in Ray's export: {expr}"
            if suffix == "_bucket":
                assert "histogram_quantile(" in expr and " le" in expr.replace("(le", "( le"), expr
    assert {"serve_app_decode_step_seconds", "serve_app_records_total", "serve_app_model_seconds"} <= queried
