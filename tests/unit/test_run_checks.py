"""The `make run` launcher's checks of what it is given, before Ray starts (serve_app/run.py): its HTTP port
free, its switches read as people write them. From a read-only review (2026-11-30)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("0", False), ("False", False),
                                       ("OFF", False), (" no ", False), ("", False)])
def test_the_dashboard_switch_reads_its_variable_as_people_write_it(monkeypatch, value, on):
    import serve_app.run as run

    seen = {}
    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.setattr(run, "_serve", lambda ns: seen.setdefault("dashboard", ns.dashboard) and 0)
    monkeypatch.setattr(run, "proxy_environment", lambda choice, run_dir, *a, **kw: ("python", {}))
    monkeypatch.setenv("SERVE_APP_RAY_DASHBOARD", value)
    run.main(["serve_config.yaml"])
    assert seen["dashboard"] is on


@pytest.mark.parametrize("name", ["SERVE_APP_RAY_DASHBOARD", "SERVE_APP_REPLACE"])
def test_both_switches_read_yes_and_no_alike_and_refuse_anything_else(monkeypatch, capsys, name):
    """Two readings: SERVE_APP_REPLACE=on was no, and SERVE_APP_RAY_DASHBOARD=ture was yes, silently."""
    import serve_app.run as run

    monkeypatch.setenv(name, "on")
    assert run.env_flag(name) is True
    monkeypatch.setenv(name, "ture")
    with pytest.raises(SystemExit) as exited:
        run.main(["serve_config.yaml"])
    assert exited.value.code == 2 and f"{name}='ture'" in capsys.readouterr().err


def test_a_bad_drain_timeout_is_a_usage_error_naming_the_option(monkeypatch, capsys):
    import serve_app.run as run

    monkeypatch.setenv("SERVE_APP_DRAIN_TIMEOUT_S", "soon")
    with pytest.raises(SystemExit) as exited:
        run.main(["serve_config.yaml"])
    assert exited.value.code == 2 and "--drain-timeout-s" in capsys.readouterr().err


def test_a_taken_port_is_refused_before_ray_starts_naming_it(monkeypatch, tmp_path, capsys):
    """HAProxy failing to bind the port later left a launcher that said it served while clients reached
    whatever held the port."""
    import argparse
    import socket

    import ray
    import yaml

    import serve_app.run as run

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started on a taken port")

    monkeypatch.setattr(ray, "init", no_ray)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = yaml.safe_load(open("serve_config.placed.yaml"))
        config["http_options"]["port"] = port
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        ns = argparse.Namespace(config=str(path), address="local", dashboard=False, drain_timeout_s=1.0)
        assert run._serve(ns) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "make run PORT=" in err



def _joined(monkeypatch, served: dict, deployed: list, config: str = "serve_config.placed.yaml", patch=None,
            replace: bool = False):
    """The launcher on a joined cluster whose Serve already serves `served`, with Ray faked; its calls."""
    import argparse
    import signal
    import threading
    from pathlib import Path
    from types import SimpleNamespace

    import ray
    from ray import serve

    import serve_app.run as run
    from serve_app import drain_signal, status

    calls: list = []
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(("ray.init", kw.get("address"))))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("ray.shutdown"))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: argparse.Namespace(gcs_address="198.18.0.1:6379"))
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications=served))
    monkeypatch.setattr(serve, "shutdown", lambda: calls.append("serve.shutdown"))
    monkeypatch.setattr(serve, "delete", lambda name, *a, **kw: calls.append(("serve.delete", name)))
    monkeypatch.setattr(drain_signal, "create", lambda: "signal")
    monkeypatch.setattr(drain_signal, "drain", lambda *a, **kw: calls.append("drained"))
    monkeypatch.setattr(status, "write_record", lambda port, address: None)
    monkeypatch.setattr(status, "remove_record", lambda port: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    stopped = threading.Event()
    stopped.set()  # the stop has come: the launcher drains and stops at once
    monkeypatch.setattr(run.threading, "Event", lambda: stopped)
    monkeypatch.setattr(run, "_deploy", lambda config: deployed.append(config))
    for (owner, name), value in (patch or {}).items():
        monkeypatch.setattr(owner, name, value)
    config = Path(__file__).resolve().parents[2] / config
    ns = argparse.Namespace(config=str(config), address="198.18.0.1:6379", dashboard=False, drain_timeout_s=1.0,
                            replace=replace)
    return run._serve(ns), calls


def test_on_a_joined_cluster_other_applications_are_neither_replaced_nor_deleted(monkeypatch, capsys):
    """A Serve config is the whole set of applications: deploying serve-app's on a cluster that serves
    another team's app would delete theirs, and `serve.shutdown` at the stop would delete everything."""
    deployed: list = []
    code, calls = _joined(monkeypatch, {"their-app": object()}, deployed)
    assert code == 1 and deployed == []
    assert "serve.shutdown" not in calls and ("serve.delete", "their-app") not in calls
    assert "the cluster already serves their-app" in capsys.readouterr().out


def test_a_refused_join_deletes_nothing_not_even_an_application_of_the_config_s_name(monkeypatch, capsys):
    """The cluster serves serve-app (someone's: this launcher deployed nothing) and another app: the launcher
    refuses, and leaves both as they were (its cleanup after a failed deploy used to delete serve-app)."""
    deployed: list = []
    code, calls = _joined(monkeypatch, {"serve-app": object(), "their-app": object()}, deployed)
    assert code == 1 and deployed == []
    assert not [c for c in calls if c == "serve.shutdown" or (isinstance(c, tuple) and c[0] == "serve.delete")]
    assert "the cluster already serves their-app" in capsys.readouterr().out


def test_on_a_joined_cluster_a_delete_that_times_out_is_reported_and_the_launcher_stops_cleanly(monkeypatch, capsys):
    from ray import serve

    deployed: list = []
    deletes: list = []

    def delete(name, *a, **kw):
        deletes.append(name)
        raise TimeoutError(f"{name} did not stop within 60 s")
    code, calls = _joined(monkeypatch, {}, deployed, config="serve_config.yaml", patch={(serve, "delete"): delete})
    assert code == 0 and len(deletes) == len(set(deletes)) > 0
    assert f"could not delete application {deletes[0]!r}" in capsys.readouterr().out


def test_a_ctrl_c_during_serve_s_stop_cuts_it_short_and_the_launcher_still_disconnects(monkeypatch, capsys):
    """Serve's stop (a delete per application on a joined cluster, serve.shutdown locally) can wait up to a
    minute; it ran with the launcher's own Ctrl-C handler, which only sets an event nobody read any more."""
    from ray import serve

    def interrupted(name, *a, **kw):  # what a Ctrl-C raises once the default handler is back
        raise KeyboardInterrupt
    code, calls = _joined(monkeypatch, {}, [], patch={(serve, "delete"): interrupted})
    assert code == 0 and calls[-1] == "ray.shutdown"
    out = capsys.readouterr().out
    assert "Serve's stop cut short by Ctrl-C" in out and "may still be on the cluster" in out


def test_a_joined_cluster_that_cannot_list_its_applications_is_reported_and_nothing_deployed(monkeypatch, capsys):
    from ray import serve

    def unreachable():
        raise TimeoutError("the controller did not answer within 30 s")
    deployed: list = []
    code, calls = _joined(monkeypatch, {}, deployed, patch={(serve, "status"): unreachable})
    assert code == 1 and deployed == [] and calls[-1] == "ray.shutdown"
    assert not [c for c in calls if isinstance(c, tuple) and c[0] == "serve.delete"]
    assert "the cluster did not say what it serves (TimeoutError(" in capsys.readouterr().out


def test_on_a_joined_cluster_the_stop_deletes_only_the_config_s_applications(monkeypatch):
    deployed: list = []
    code, calls = _joined(monkeypatch, {}, deployed)
    assert code == 0 and len(deployed) == 1
    assert calls[-3:] == ["drained", ("serve.delete", "serve-app"), "ray.shutdown"]
    assert "serve.shutdown" not in calls


def test_an_application_of_the_config_s_name_is_replaced_only_when_asked(monkeypatch, capsys):
    """A RayService names its application serve-app too: joined, the launcher replaced it, and deleted it at its stop
    (or, its deploy failing, deleted it without having replaced it). Refused unless --replace (SERVE_APP_REPLACE=1):
    a launcher killed before its stop left its own there."""
    deployed: list = []
    code, calls = _joined(monkeypatch, {"serve-app": object()}, deployed)
    assert code == 1 and deployed == []
    assert not [c for c in calls if c == "serve.shutdown" or (isinstance(c, tuple) and c[0] == "serve.delete")]
    assert "already serves serve-app, of this config's names" in capsys.readouterr().out
    code, calls = _joined(monkeypatch, {"serve-app": object()}, deployed, replace=True)
    assert code == 0 and len(deployed) == 1 and ("serve.delete", "serve-app") in calls


def test_ray_address_auto_is_refused(monkeypatch, capsys):
    """`ray.init(address="auto")` joins the cluster the machine's last `ray start` recorded, dead or alive."""
    import pytest

    from serve_app import run

    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(SystemExit):
        run.main(["serve_config.yaml"])
    assert "name it as host:port, or local" in capsys.readouterr().err


def test_a_second_ctrl_c_cuts_the_drain_short_and_gives_the_launcher_its_handler_back():
    """The drain waits up to --drain-timeout-s (30 s) for in-flight requests; a second Ctrl-C stops waiting."""
    import signal
    import threading
    import time

    from serve_app.run import drain_unless_interrupted

    stops = []
    previous = signal.signal(signal.SIGINT, lambda *_: stops.append(1))  # the launcher's first-Ctrl-C handler
    try:
        def slow_drain():  # a wait that only a signal ends early, as ray.get's does
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(30)

        began = time.monotonic()
        assert drain_unless_interrupted(slow_drain) is True
        assert time.monotonic() - began < 20 and stops == []
        assert drain_unless_interrupted(lambda: None) is False
        os.kill(os.getpid(), signal.SIGINT)  # after the drain: the launcher's handler again, no KeyboardInterrupt
        threading.Event().wait(0.2)
        assert stops == [1]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_on_a_joined_cluster_the_launcher_does_not_describe_a_proxy_it_did_not_choose(monkeypatch, capsys):
    """The cluster's nodes chose their HTTP proxy when they started; the launcher said "HAProxy (its stats page on
    :8404 ...)" of the proxy it would have started for a Ray instance of its own."""
    import serve_app.run as run

    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.setattr(run, "_serve", lambda ns: 0)
    monkeypatch.setattr(run, "proxy_environment", lambda choice, run_dir, *a, **kw: ("haproxy", {}))
    assert run.main(["serve_config.yaml", "--address", "198.18.0.1:6379"]) == 0
    said = capsys.readouterr().out
    assert "the joined cluster's own" in said and "HAProxy" not in said
    assert run.main(["serve_config.yaml", "--address", "local"]) == 0
    assert "HTTP proxy: HAProxy" in capsys.readouterr().out
