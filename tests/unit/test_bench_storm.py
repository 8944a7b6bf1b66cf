"""The client storm (bench/compare/storm.lua under the real wrk, against a stdlib HTTP server) and
issue 24's target verdicts (bench/compare/peer_targets.py). No Ray."""

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.compare import peer_targets, report
from bench.compare.load import Target, run_closed, run_storm, write_texts


class _Shedding(BaseHTTPRequestHandler):
    """Every third request 503 at once; the others 200 after 60 ms. Echoes X-Request-Id as Serve does,
    except on the requests ending in 7, which are answered without it (counted, not timed)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall
    seen = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's naming)
        assert self.headers["Content-Type"] == "application/json"  # or serve-app answers 422
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))  # a bad body drops the connection
        assert "input" in body or len(body["payload"]["records"]) == 16
        with _Shedding.lock:
            _Shedding.seen += 1
            n = _Shedding.seen
        status = 503 if n % 3 == 0 else 200
        if status == 200:
            time.sleep(0.06)
        body = b'{"ok":true}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        request_id = self.headers.get("X-Request-Id", "")
        if not request_id.endswith("7"):
            self.send_header("X-Request-ID", request_id)
        if status == 503:
            self.send_header("Retry-After", "2")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def shedding_url():
    """A _Shedding server on a free port, its count reset; shut down after the test."""
    assert shutil.which("wrk"), "wrk is installed by `make test` (scripts/install-system-deps)"
    _Shedding.seen = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Shedding)
    server.handle_error = lambda *_: None  # wrk closes its connections mid-request when the run ends
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_storm_counts_every_answer_by_status_and_times_the_echoed_ones(shedding_url, tmp_path):
    texts = write_texts(("one text", "another"), tmp_path / "texts.jsonl")
    figures = run_storm(Target(shedding_url, "/embeddings", "embeddings", 1, ()), texts, clients=8, seconds=2)
    ok, refused = figures["statuses"]["200"], figures["statuses"]["503"]
    # every answer counted (wrk stops with at most one request per client unanswered)
    assert _Shedding.seen - 8 <= ok["count"] + refused["count"] <= _Shedding.seen
    assert abs(refused["count"] - (ok["count"] + refused["count"]) / 3) <= 8  # one in three, give or take the tail
    assert 0.8 * ok["count"] <= ok["timed"] < ok["count"]  # those without the echo are not timed
    assert ok["p50_ms"] >= 60.0 > refused["p50_ms"]  # timed apart: the 503s are not averaged in
    assert figures["goodput_rps"] == pytest.approx(ok["count"] / figures["duration_s"], rel=0.01)
    assert figures["socket_errors"] == 0


def test_closed_loop_cells_count_only_200s_as_answered(shedding_url, tmp_path):
    """closed.lua under the real wrk: the same bodies (bodies.lua), 503s are errors, not throughput."""
    texts = write_texts(("one text", "another"), tmp_path / "texts.jsonl")
    figures = run_closed(Target(shedding_url, "/translation", "translation", 16, ()), texts, concurrency=4, seconds=1)
    assert figures["ok"] > 0 and figures["errors"] == pytest.approx(figures["ok"] / 2, abs=4)
    assert figures["records_per_s"] == pytest.approx(16 * figures["requests_per_s"], rel=0.01)
    assert figures["p50_ms"] > 0


def _cell(contender, clients, rps, records=1, p50=10.0):
    return {"contender": contender, "workload": "embeddings", "records": records, "mode": "closed",
            "concurrency": clients, "records_per_s": rps, "requests_per_s": rps / records, "p50_ms": p50,
            "p99_ms": 2 * p50, "errors": 0}


def _results(cells):
    return {"profile": "peers", "started_at": "now", "machine": "m", "workloads": ["embeddings"],
            "records": [1, 16], "contenders": ["serve_app_placed", "mosec", "litserve"],
            "labels": {"serve_app_placed": "serve-app", "mosec": "mosec", "litserve": "LitServe"},
            "offline": {"embeddings": {"records_per_s": 400.0, "best_batch": 64,
                                       "batches": {"1": {"batch_s": 0.02, "records_per_s": 50.0}}}},
            "cells": cells, "failures": [], "first_answer_s": {"serve_app_placed/embeddings": 12.0},
            "startup_s": {}, "memory": {}}


def test_issue_24_verdicts_come_from_the_best_peer_the_offline_limit_and_the_storm():
    cells = [_cell("serve_app_placed", 64, 320.0), _cell("mosec", 64, 300.0), _cell("litserve", 64, 200.0),
             _cell("serve_app_placed", 32, 330.0), _cell("mosec", 32, 290.0),
             _cell("serve_app_placed", 1, 40.0, p50=25.0), _cell("mosec", 1, 45.0),
             {"contender": "serve_app_placed", "workload": "embeddings", "records": 1, "mode": "storm",
              "concurrency": 200, "goodput_rps": 280.0, "records_per_s": 280.0, "socket_errors": 0,
              "statuses": {"200": {"count": 4200, "timed": 4200, "p50_ms": 150.0, "p99_ms": 900.0},
                           "503": {"count": 900, "timed": 900, "p50_ms": 30.0, "p99_ms": 80.0}}}]
    rows = {t["target"]: t for t in peer_targets.targets(_results(cells), "serve_app_placed", ["mosec", "litserve"])}
    at = lambda prefix: next(t for k, t in rows.items() if k.startswith(prefix))  # noqa: E731
    assert at("64 clients x 1 text: ahead")["figure"] == pytest.approx(1.067, abs=1e-3)
    assert at("64 clients x 1 text: ahead")["met"] is False  # ahead, but not by 10 %
    assert at("32 clients x 1 text")["met"] is True and at("32 clients x 1 text")["detail"] == "best peer: mosec"
    assert at("1 clients x 1 text")["met"] is False
    assert at("8 clients")["met"] is None and at("32 clients x 16")["met"] is None  # not measured, not met
    assert at("64 clients x 1 text: served")["figure"] == 0.8 and at("64 clients x 1 text: served")["met"]
    assert at("1 client: p50")["figure"] == 1.25 and at("1 client: p50")["met"]
    assert at("storm: goodput")["figure"] == pytest.approx(280 / 330, abs=1e-3)
    assert at("storm: goodput")["met"] is True
    assert at("storm: 503s")["figure"] == 80.0 and at("storm: 503s")["met"] is False
    assert at("ready")["met"] is True
    text = report.markdown(_results(cells))
    assert "### Issue 24's targets: serve-app against mosec, litserve" in text
    assert "| serve-app | 200 | 280.0 | 330.0 | 0.848 | 200: 4200 (150.0 / 900.0); 503: 900 (30.0 / 80.0) | 0 |" in text


def test_a_contender_serving_on_onnx_is_judged_against_the_onnx_offline_sweep():
    """make run serves embeddings on ONNX Runtime: its batch of 1 and offline limit are ONNX Runtime's."""
    cells = [_cell("serve_app_placed", 64, 320.0), _cell("serve_app_placed", 1, 40.0, p50=25.0)]
    results = _results(cells)
    results["offline"]["embeddings@onnx"] = {"records_per_s": 500.0, "best_batch": 64,
                                             "batches": {"1": {"batch_s": 0.01, "records_per_s": 100.0}}}
    torch_rows = {t["target"]: t for t in peer_targets.targets(results, "serve_app_placed", ["mosec"])}
    results["contender_info"] = {"serve_app_placed/embeddings": {"data": [
        {"task": "translation", "details": {}}, {"task": "embeddings", "details": {"engine": "onnx"}}]}}
    onnx_rows = {t["target"]: t for t in peer_targets.targets(results, "serve_app_placed", ["mosec"])}
    p50 = "1 client: p50 <= 1.5 x the offline batch-of-1 time"
    served = "64 clients x 1 text: served >= 0.75 x the offline limit"
    assert (torch_rows[p50]["figure"], onnx_rows[p50]["figure"]) == (1.25, 2.5)
    assert onnx_rows[p50]["met"] is False and "batch of 1 (onnx) 10.0 ms" in onnx_rows[p50]["detail"]
    assert (torch_rows[served]["figure"], onnx_rows[served]["figure"]) == (0.8, 0.64)
