"""Unit tests of the load tests' own logic: payloads, body checkers, response
classification (503 = shed, with Retry-After), the SLO figures and verdict, the
SLO flags as Locust's own parser reads them, the shapes' schedules and the report's
matrix table. No server.

`locustfiles/common.py`, `slo.py` and `report.py` do not import Locust (importing it
would gevent-patch the pytest process); the shapes and base.py do, so they are
checked in a subprocess.

Why this module is long: one short test per rule of the load tests' checks and SLO verdict; they share the payload fixtures.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from email.utils import formatdate
from pathlib import Path

import pytest

LOCUSTFILES = Path(__file__).resolve().parents[2] / "locustfiles"


def _load(name: str):
    if str(LOCUSTFILES) not in sys.path:  # the locustfiles import each other by name, as Locust runs them
        sys.path.insert(0, str(LOCUSTFILES))
    spec = importlib.util.spec_from_file_location(f"_locustfiles_{name}", LOCUSTFILES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


common = _load("common")
slo = _load("slo")
report = _load("report")


def test_common_slo_and_report_do_not_import_locust():
    for module in (common, slo, report):
        assert "locust" not in vars(module) and "gevent" not in vars(module), module.__name__


# --------------------------------------------------------------------- payloads

def test_sentence_pool_is_large_varied_and_unique():
    pool = common.SENTENCES
    assert len(pool) >= 100
    assert len(set(pool)) == len(pool), "duplicate sentences"
    lengths = sorted(len(s) for s in pool)
    assert sum(n < 40 for n in lengths) >= 20, "too few short sentences"
    assert sum(40 <= n < 150 for n in lengths) >= 20, "too few medium sentences"
    assert sum(n >= 150 for n in lengths) >= 20, "too few long sentences"
    assert all(s.strip() == s and s for s in pool)


def test_translation_payload_shape_and_unique_ids():
    one, sixteen = common.translation_payload(1), common.translation_payload(16)
    assert one["payload"]["fromLang"] == "en" and one["payload"]["toLang"] == "pt"
    assert len(one["payload"]["records"]) == 1 and len(sixteen["payload"]["records"]) == 16
    ids = [r["id"] for p in (one, sixteen) for r in p["payload"]["records"]]
    assert len(set(ids)) == 17 and all(isinstance(i, str) and i for i in ids)
    assert all(r["text"] in common.SENTENCES for r in sixteen["payload"]["records"])
    with pytest.raises(ValueError):
        common.translation_payload(0)


def test_embeddings_payload_string_for_one_list_for_many():
    assert isinstance(common.embeddings_payload(1)["input"], str)
    many = common.embeddings_payload(16)["input"]
    assert isinstance(many, list) and len(many) == 16


# --------------------------------------------------------------------- checkers

def _translation_answer(request, **changes):
    return {"result": [{"id": r["id"], "text": "olá " + r["text"]} for r in request["payload"]["records"]]}


def test_check_translation_accepts_a_right_answer():
    req = common.translation_payload(16)
    assert common.check_translation(req, _translation_answer(req)) is None


@pytest.mark.parametrize("mutate, expect", [
    (lambda b: b["result"].pop(), "records for"),
    (lambda b: b["result"].append({"id": "extra", "text": "x"}), "records for"),
    (lambda b: b["result"].reverse(), "expected"),
    (lambda b: b["result"][3].update(id="other"), "expected"),
    (lambda b: b["result"][5].update(text=""), "empty"),
    (lambda b: b["result"][5].update(text="   "), "empty"),
    (lambda b: b["result"][5].pop("text"), "empty"),
    (lambda b: b["result"][2].update(text=None), "empty"),
    (lambda b: b.pop("result"), "no 'result'"),
    (lambda b: b.update(result={"id": "1"}), "no 'result'"),
    (lambda b: b["result"].__setitem__(0, "text"), "not an object"),
])
def test_check_translation_rejects_wrong_answers(mutate, expect):
    req = common.translation_payload(16)
    body = _translation_answer(req)
    mutate(body)
    problem = common.check_translation(req, body)
    assert problem is not None and expect in problem


def test_check_translation_rejects_non_objects():
    req = common.translation_payload(1)
    assert common.check_translation(req, [{"id": "1", "text": "x"}]) is not None
    assert common.check_translation(req, None) is not None


def _unit(dim=384, seed=1.0):
    raw = [math.sin(seed * (i + 1)) for i in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def _embeddings_answer(n, dim=384):
    return {"object": "list", "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1},
            "data": [{"object": "embedding", "index": i, "embedding": _unit(dim, i + 1.0)} for i in range(n)]}


def test_check_embeddings_accepts_right_answers():
    assert common.check_embeddings(common.embeddings_payload(1), _embeddings_answer(1)) is None
    assert common.check_embeddings(common.embeddings_payload(16), _embeddings_answer(16)) is None


@pytest.mark.parametrize("mutate, expect", [
    (lambda b: b["data"].pop(), "vectors for"),
    (lambda b: b["data"][1].update(index=0), "index"),
    (lambda b: b["data"].reverse(), "index"),
    (lambda b: b["data"][0].update(embedding=_unit(383)), "383 values"),
    (lambda b: b["data"][0].update(embedding=_unit(768)), "768 values"),
    (lambda b: b["data"][0].update(embedding="AAAA"), "expected 384"),
    (lambda b: b["data"][0].update(embedding=[2 * x for x in _unit()]), "norm"),
    (lambda b: b["data"][0].update(embedding=[0.0] * 384), "norm"),
    (lambda b: b["data"][0]["embedding"].__setitem__(7, float("nan")), "non-finite"),
    (lambda b: b["data"][0]["embedding"].__setitem__(7, "0.1"), "non-numeric"),
    (lambda b: b["data"][0]["embedding"].__setitem__(7, True), "non-numeric"),
    (lambda b: b.update(object="embedding"), "type 'list'"),
    (lambda b: b.pop("data"), "'data' list"),
])
def test_check_embeddings_rejects_wrong_answers(mutate, expect):
    req = common.embeddings_payload(4)
    body = _embeddings_answer(4)
    mutate(body)
    problem = common.check_embeddings(req, body)
    assert problem is not None and expect in problem


# --------------------------------------------------------------------- classification

def _classify(status, body=None, headers=None, checker=None, request=None):
    def read_json():
        if isinstance(body, Exception):
            raise body
        return body
    req = request or common.translation_payload(2)
    return common.classify(status, headers or {}, read_json, checker or common.check_translation, req)


def test_classify_200_right_body_is_ok():
    req = common.translation_payload(2)
    assert _classify(200, _translation_answer(req), request=req).kind == "ok"


def test_classify_200_wrong_body_is_a_failure():
    req = common.translation_payload(2)
    body = _translation_answer(req)
    body["result"].reverse()
    out = _classify(200, body, request=req)
    assert out.kind == "fail" and "wrong body" in out.message
    assert _classify(200, ValueError("not json")).kind == "fail"


def test_classify_503_is_shed_with_retry_after():
    out = _classify(503, {"error": "busy", "error_type": "overloaded"}, {"Retry-After": "3"})
    assert out.kind == "shed" and out.retry_after_s == 3.0
    assert _classify(503).retry_after_s == common.DEFAULT_RETRY_AFTER_S


@pytest.mark.parametrize("status", [400, 413, 422, 500, 504, 404])
def test_classify_other_statuses_fail(status):
    out = _classify(status, {"error": "x", "error_type": "some_code"})
    assert out.kind == "fail" and str(status) in out.message and "some_code" in out.message


def test_classify_no_response_fails():
    out = common.classify(0, None, lambda: None, common.check_translation, common.translation_payload(1),
                          error=ConnectionRefusedError())
    assert out.kind == "fail" and "ConnectionRefused" in out.message


def test_parse_retry_after():
    assert common.parse_retry_after("2") == 2.0
    assert common.parse_retry_after(" 2.5 ") == 2.5
    assert common.parse_retry_after(None) == common.DEFAULT_RETRY_AFTER_S
    assert common.parse_retry_after("soon") == common.DEFAULT_RETRY_AFTER_S
    assert common.parse_retry_after("-4") == 0.0
    assert common.parse_retry_after("86400") == common.MAX_RETRY_AFTER_S
    now = 1_800_000_000.0
    assert common.parse_retry_after(formatdate(now + 5, usegmt=True), now=now) == pytest.approx(5.0)


# --------------------------------------------------------------------- SLO

def _entries(ok_ms=100, n_ok=95, n_fail=0, n_shed=0, slow_ms=None, n_slow=0):
    times = {ok_ms: n_ok + n_fail}
    if n_slow:
        times[slow_ms] = n_slow
    rows = [("/translation 1rec", n_ok + n_fail + n_slow, n_fail, times)]
    if n_shed:
        rows.append(("/translation 1rec" + slo.SHED_SUFFIX, n_shed, 0, {1: n_shed}))
    return rows


def test_percentile_like_locust():
    assert slo.percentile({}, 0.95) is None
    assert slo.percentile({10: 95, 1000: 5}, 0.95) == 10
    assert slo.percentile({10: 94, 1000: 6}, 0.95) == 1000


def test_slo_figures_keep_shed_out_of_errors_and_p95():
    fig = slo.slo_figures(_entries(n_ok=90, n_fail=2, n_shed=50, slow_ms=4000, n_slow=8))
    assert fig.requests == 150 and fig.shed == 50 and fig.errors == 2
    assert fig.error_ratio == pytest.approx(2 / 100)  # over requests not shed
    assert fig.shed_ratio == pytest.approx(50 / 150)
    assert fig.p95_ms == 4000  # the fast 503s (1 ms) must not pull p95 down


def test_slo_verdict_passes_within_limits_and_at_the_limit():
    ok, line = slo.slo_verdict(slo.slo_figures(_entries(n_ok=99, n_fail=1)), 0.01, 200, 0.0)
    assert ok and line.startswith("SLO PASS") and "p95=100 ms" in line and "errors=1" in line


@pytest.mark.parametrize("entries, limits, breach", [
    (_entries(n_ok=97, n_fail=3), (0.01, 5000, 0.05), "error ratio"),
    (_entries(n_ok=100, n_shed=20), (0.01, 5000, 0.05), "shed ratio"),
    (_entries(n_ok=90, slow_ms=9000, n_slow=10), (0.01, 5000, 0.05), "p95"),
    ([], (0.01, 5000, 0.05), "no requests"),
])
def test_slo_verdict_fails_on_each_breach(entries, limits, breach):
    ok, line = slo.slo_verdict(slo.slo_figures(entries), *limits)
    assert not ok and line.startswith("SLO FAIL") and breach in line


SLO_FLAGS_CHECK = textwrap.dedent("""
    import os, sys
    sys.argv = ["locust", "-f", os.path.join(sys.argv[1], "mixed.py")]
    sys.path.insert(0, sys.argv[1])
    import mixed  # noqa: F401  (declares the flags through base.py)
    from locust.argument_parser import parse_options
    o = parse_options()
    print(o.slo_max_error_ratio, o.slo_p95_ms, o.slo_max_shed_ratio)
""")


def test_slo_flags_come_from_locust_s_own_config_and_environment(tmp_path):
    """Locust reads `[tool.locust]` of the working directory's pyproject.toml, then LOCUST_* variables,
    for our flags as for its own: no copy of that here."""
    (tmp_path / "pyproject.toml").write_text('[tool.locust]\nslo-p95-ms = 1234\nslo-max-shed-ratio = 0.2\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}

    def flags(cwd, **extra):
        proc = subprocess.run([sys.executable, "-c", SLO_FLAGS_CHECK.replace("sys.argv[1]", repr(str(LOCUSTFILES)))],
                              cwd=cwd, env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return tuple(float(x) for x in proc.stdout.split()[-3:])

    assert flags(tmp_path, LOCUST_SLO_MAX_SHED_RATIO="0.5") == (0.01, 1234.0, 0.5)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert flags(empty) == tuple(slo.SLO_DEFAULTS.values())
    # the repository's own [tool.locust] (what `make load` and tests/load run with) agrees with the defaults
    assert flags(LOCUSTFILES.parent) == tuple(slo.SLO_DEFAULTS.values())


# --------------------------------------------------------------------- shapes (subprocess: they import locust)

SHAPES_CHECK = textwrap.dedent("""
    import shapes
    m = shapes.StressMatrix(users=10, cell_seconds=30, gap_seconds=5)
    assert m.at(0) == (10, 50.0, (1, 0.5)), m.at(0)
    assert m.at(31)[0] == 0 and m.at(31)[2] is None
    assert m.at(35)[2] == (1, 0.1)
    assert [m.at(i * 35 + 1)[2] for i in range(6)] == list(shapes.MATRIX_CELLS)
    assert m.at(6 * 35) is None
    r = shapes.StepRamp(start_users=1, step_users=2, step_seconds=20, max_users=7)
    assert [r.at(t)[0] for t in (0, 19, 20, 40, 60)] == [1, 1, 3, 5, 7]
    assert r.at(80) is None
    b = shapes.Burst(quiet_users=1, burst_users=30, quiet_seconds=10, burst_seconds=20, cooldown_seconds=30)
    assert [b.at(t)[0] for t in (0, 10, 29, 30, 59)] == [1, 30, 30, 1, 1] and b.at(60) is None
    assert shapes.cell_tag(16, 0.01) == "16rec @0.01s"
    import stress_matrix
    names = {shapes.cell_class_name(r, p) for r, p in shapes.MATRIX_CELLS}
    assert names <= set(vars(stress_matrix)), names
    assert {getattr(stress_matrix, n).pacing for n in names} == {0.5, 0.1, 0.01}
    print("shapes ok")
""")


def test_shapes_schedules():
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    proc = subprocess.run([sys.executable, "-c", SHAPES_CHECK], cwd=LOCUSTFILES, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "shapes ok" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------- report

def test_report_matrix_table_from_stats_rows():
    pct = {k: "" for k in ("50%", "95%", "99%")}
    stats = [
        {"Name": "/translation 16rec @0.10s", "Request Count": "60", "Failure Count": "3",
         **pct, "50%": "900", "95%": "2000", "99%": "2500"},
        {"Name": "/translation 16rec @0.10s [shed]", "Request Count": "40", "Failure Count": "0", **pct},
        {"Name": "/translation 1rec @0.50s", "Request Count": "50", "Failure Count": "0",
         **pct, "50%": "80", "95%": "150", "99%": "200"},
        {"Name": "Aggregated", "Request Count": "150", "Failure Count": "3", **pct},
    ]
    history = [
        {"Timestamp": "100", "User Count": "10", "Name": "/translation 1rec @0.50s", "Total Request Count": "10"},
        {"Timestamp": "110", "User Count": "10", "Name": "/translation 1rec @0.50s", "Total Request Count": "50"},
        {"Timestamp": "120", "User Count": "10", "Name": "/translation 16rec @0.10s", "Total Request Count": "30"},
        {"Timestamp": "130", "User Count": "10", "Name": "/translation 16rec @0.10s", "Total Request Count": "60"},
    ]
    cells = report.matrix_cells(stats, history)
    assert [(c.records, c.pacing) for c in cells] == [(1, 0.5), (16, 0.1)]
    heavy = cells[1]
    assert (heavy.total, heavy.ok, heavy.shed, heavy.users) == (100, 57, 40, 10)
    table = report.matrix_markdown(cells)
    row = [line for line in table.splitlines() if line.startswith("| 16 |")][0]
    cols = [c.strip() for c in row.strip("|").split("|")]
    # records, pacing, users, offered, requests, success %, shed %, error %, p50, p95, p99
    assert cols[:11] == ["16", "0.1 s", "10", "100", "100", "57.0", "40.0", "3.0", "900", "2000", "2500"]
