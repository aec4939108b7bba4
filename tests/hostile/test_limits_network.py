"""GYM-10 on Docker: a sandbox's writable size and memory are bounded by default, and a public-network sandbox
reaches neither a host service (127.0.0.1, 0.0.0.0 through the bridge gateway or any host address) nor a sibling
sandbox nor another Docker network's container.

Real Docker for the attacks (the engine's storage driver bounds size; the host filter is installed for real);
the refusals where an engine cannot bound size or filter the network are simulated by replacing the capability
probe, in tests that start nothing.
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import threading

import pytest

from harbor_gym import sandbox as sandbox_pkg
from harbor_gym.episode import Episode
from harbor_gym.errors import SeedRefusedError
from harbor_gym.sandbox import _engine, _netfilter
from harbor_gym.sandbox._docker_container import build_host_config, storage_size_mb
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.task import load_task

from .helpers import BASE_IMAGE, LABEL, config, grade, run_episode, toml, write_task

MiB = 1 << 20
STORAGE = "harbor_gym:storage_exceeded"
PUBLIC = ('network_mode = "no-network"', 'network_mode = "public"')


def _settings() -> SandboxSettings:
    """The suite's settings (its label; this host's image aliases and pull policy, so nothing is pulled)."""
    return SandboxSettings.from_config(config())


def _written(client, sb) -> int:
    """Bytes the writer got onto disk: the engine's ``SizeRw`` where it can size the layer; on btrfs simple quotas
    it cannot once the layer is over quota (-1), then the blocks of the writer's files (``du``, through an exec whose
    wrapper keeps its temporary files in /dev/shm, since the disk is full)."""
    listed = client.api.containers(all=True, size=True, filters={"id": sb.container_id})
    size = int(listed[0].get("SizeRw") or 0)
    if size >= 0:
        return size
    res = sb.exec("du -ck /fill* /huge 2>/dev/null | tail -1", timeout=60, user="root", env={"TMPDIR": "/dev/shm"})
    return int(res.stdout.split()[0]) * 1024


# --- storage ---------------------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.parametrize("writer", [
    "dd if=/dev/zero of=/fill bs=4M count=1000 2>/dev/null; sync",
    "for i in $(seq 1 64); do fallocate -l 16M /fill$i || break; done; fallocate -l 10G /huge; sync",
], ids=["dd", "fallocate"])
def test_gym_10_a_writer_goes_at_most_128_mib_past_storage_mb(writer, docker_client):
    # SPEC: GYM-10 — storage_mb = 256 is applied on this engine (not a LOAD-24 refusal) and a writer at full speed
    # (dd) or allocating instantly (fallocate, which a polling watchdog would miss) ends within 128 MiB past it
    spec = SandboxSpec(image=BASE_IMAGE, storage_mb=256, name_hint="fill")
    with sandbox_pkg.open(spec, backend="docker", settings=_settings()) as sb:
        res = sb.exec(writer, timeout=120, user="root")
        assert not res.timed_out
        used = _written(docker_client, sb)
        assert 200 * MiB <= used <= (256 + 128) * MiB, used  # bounded, and the bound is storage_mb (not less)
        assert sb.storage_exceeded()
        assert sb.is_alive()


@pytest.mark.docker
def test_gym_10_storage_exceeded_is_false_below_the_bound(docker_client):
    # SPEC: GYM-10 — the engine-side measure does not cry wolf: 64 MiB written under a 256 MiB bound
    spec = SandboxSpec(image=BASE_IMAGE, storage_mb=256, name_hint="below")
    with sandbox_pkg.open(spec, backend="docker", settings=_settings()) as sb:
        assert sb.exec("dd if=/dev/zero of=/part bs=1M count=64 2>/dev/null; sync", timeout=60).ok
        assert not sb.storage_exceeded()


@pytest.mark.docker
def test_gym_10_a_task_with_storage_mb_256_runs_and_a_filler_ends_the_turn_as_storage_exceeded(tmp_path):
    # SPEC: GYM-10 — the task runs (graded 1.0) when the agent stays within storage_mb; when the agent fills its
    # disk, the verifier cannot write its reward and the turn ends with harbor_gym:storage_exceeded, naming storage
    files = {"task.toml": toml(["s1"], env="storage_mb = 256"), "tests/test.sh": grade("[ -f /app/done ]")}
    ok = write_task(tmp_path, files, name="storage-ok")
    results, final = run_episode(ok, "touch /app/done")
    assert final.graded and final.reward == 1.0 and results[0].record.failure_kind is None

    full = write_task(tmp_path, files, name="storage-full")
    fill = "dd if=/dev/zero of=/fill bs=4M count=1000 2>/dev/null; touch /app/done; sync"
    results, final = run_episode(full, fill)
    rec = results[0].record
    assert rec.failure_kind == STORAGE and "storage" in (rec.failure_message or "")
    assert results[0].truncated and not final.graded and final.failure_kind == STORAGE


@pytest.mark.docker
def test_gym_10_default_storage_and_memory_caps_are_in_the_host_config(tmp_path, docker_client):
    # SPEC: GYM-10 — a task setting neither storage_mb nor memory_mb gets EnvConfig's defaults (10240 MiB writable,
    # 4096 MiB memory without swap); None lifts them
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": grade("true")}, name="defaults")
    seen = []

    def factory(spec):
        sb = sandbox_pkg.open(spec, backend="docker", settings=_settings())
        seen.append(sb)
        return sb

    for cfg, memory, storage in ((config(), 4096 * MiB, True), (config(default_storage_mb=None,
                                                                        default_memory_mb=None), 0, False)):
        with Episode(load_task(task, cfg), cfg, sandbox_factory=factory) as ep:
            ep.start()
            host = docker_client.api.inspect_container(seen[-1].container_id)["HostConfig"]
            assert host["Memory"] == memory and host["MemorySwap"] == (memory or 0)
            assert ("size" in (host.get("StorageOpt") or {})) is storage
            if storage:  # btrfs counts the image inside the size; the writable bound itself is the default
                assert seen[-1].spec.storage_mb == 10240


def test_gym_10_storage_size_counts_the_image_where_the_driver_does():
    # SPEC: GYM-10 — btrfs limits the container's whole subvolume, so the size is storage_mb plus the image
    assert storage_size_mb(256, image_bytes=163 * MiB + 1, includes_image=True) == 256 + 164
    assert storage_size_mb(256, image_bytes=163 * MiB, includes_image=False) == 256
    hc = build_host_config(SandboxSpec(image="x", network=True, storage_mb=256), public_network="harbor-gym-public",
                           storage_size=420)
    assert hc["network_mode"] == "harbor-gym-public" and hc["storage_opt"] == {"size": "420M"}


def test_gym_10_driver_support_is_judged_from_docker_info():
    # SPEC: GYM-10 — what the engine needs is named when it cannot bound size
    judge = _engine.storage_driver_support
    assert not judge({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}).supported
    assert "pquota" in judge({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]]}).reason
    assert judge({"Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "xfs"]]}).supported
    assert judge({"Driver": "btrfs"}).includes_image and judge({"Driver": "btrfs"}).supported
    assert not judge({"Driver": "vfs"}).supported


def _unstarted_episode(tmp_path, env: str, **over):
    task = write_task(tmp_path, {"task.toml": toml(["s1"], env=env).replace(*PUBLIC) if "public" in over.get(
        "_net", "") else toml(["s1"], env=env), "tests/test.sh": grade("true")}, name="refusal")
    over.pop("_net", None)
    cfg = config(**over)
    return Episode(load_task(task, cfg), cfg, sandbox_factory=_no_sandbox)


def _no_sandbox(spec):
    raise AssertionError("a refused task must not start a sandbox")


def test_gym_10_an_engine_that_cannot_bound_size_refuses_at_seed(tmp_path, monkeypatch):
    # SPEC: GYM-10 — refused at seed, naming why and what the engine needs; nothing is refused when nothing asks
    # for a bound (default_storage_mb=None and no storage_mb)
    reason = "the engine's storage driver is overlay2 on extfs, which cannot bound a container's size"
    monkeypatch.setattr(_engine, "storage_support", lambda client: _engine.StorageSupport(reason))
    with _unstarted_episode(tmp_path, "storage_mb = 10240") as ep:
        with pytest.raises(SeedRefusedError) as err:
            ep.start()
    assert err.value.rule == "GYM-10" and "overlay2 on extfs" in str(err.value)
    assert "storage_mb" in str(err.value.field)
    with _unstarted_episode(tmp_path, "", default_storage_mb=None) as ep:
        ep._engine_refusals(ep_spec(ep))  # no storage asked for: nothing refused


def ep_spec(ep):
    from harbor_gym.episode._spec import agent_spec

    return agent_spec(ep.task, default_storage_mb=ep.config.default_storage_mb)


def test_gym_10_unfiltered_public_network_is_refused_unless_allowed(tmp_path, monkeypatch, caplog):
    # SPEC: GYM-10 — where the host filter cannot be installed (simulated: a rootless engine), a public-network
    # task is refused at seed by default, naming why; unfiltered_network="allow" runs it and logs what is reachable
    unfiltered = _netfilter.PublicNetwork("harbor-gym-public", None, "the engine's bridge is not in this host's "
                                          "network namespace (a remote or rootless engine)")
    monkeypatch.setattr(_netfilter, "public_network", lambda client: unfiltered)
    monkeypatch.setattr(_engine, "storage_support", lambda client: _engine.StorageSupport(None))
    with _unstarted_episode(tmp_path, "", _net="public") as ep:
        with pytest.raises(SeedRefusedError) as err:
            ep.start()
    assert err.value.rule == "GYM-10" and "rootless" in str(err.value) and "unfiltered_network" in str(err.value)
    with _unstarted_episode(tmp_path, "", _net="public", unfiltered_network="allow") as ep:
        with caplog.at_level(logging.WARNING, logger="harbor_gym.episode"):
            ep._engine_refusals(ep_spec(ep))
    assert any("reach" in r.getMessage() and "gateway" in r.getMessage() for r in caplog.records)


# --- network ---------------------------------------------------------------------------------------------------

_PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        print("REACHED", target)
    except OSError as exc:
        print("blocked", target, type(exc).__name__)
"""


class _Server:
    """A host TCP server accepting (and closing) connections on ``host``, on a free port."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.5)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def _host_addresses() -> list[str]:
    """This host's own non-loopback IPv4 addresses (from ``ip``), the bridges' included."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [m.group(1) for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/", out) if not m.group(1).startswith("127.")]


def _wait_serving(ip: str, port: int, timeout: float = 20) -> None:
    import time

    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def _reached(sb, targets: list[str]) -> list[str]:
    res = sb.exec(["python3", "-c", _PROBE, *targets], timeout=60)
    assert res.exit_code == 0 and res.stdout.count("\n") >= len(targets), res
    return [line.split()[1] for line in res.stdout.splitlines() if line.startswith("REACHED")]


@pytest.mark.docker
def test_gym_10_no_host_service_is_reachable_from_a_public_sandbox(docker_client):
    # SPEC: GYM-10 — host servers on 127.0.0.1 and on 0.0.0.0 are reached by the host itself through the bridge
    # gateway and its own addresses, but from a public-network sandbox none of them: not 127.0.0.1 (its own
    # loopback), not the bridge gateway, not the host's non-loopback address, not another bridge's host address
    loop, anyv4 = _Server("127.0.0.1"), _Server("0.0.0.0")
    try:
        net = _netfilter.public_network(docker_client)
        assert net.filtered, net.unfiltered_reason
        host_ips = _host_addresses()
        assert net.gateway in host_ips
        for ip in host_ips:  # positive control: the service answers on each of them from the host itself
            socket.create_connection((ip, anyv4.port), timeout=2).close()
        targets = [f"127.0.0.1:{loop.port}", f"127.0.0.1:{anyv4.port}", f"{net.gateway}:{loop.port}"]
        targets += [f"{ip}:{anyv4.port}" for ip in host_ips]
        spec = SandboxSpec(image=BASE_IMAGE, network=True, name_hint="net-host")
        with sandbox_pkg.open(spec, backend="docker", settings=_settings()) as sb:
            networks = docker_client.api.inspect_container(sb.container_id)["NetworkSettings"]["Networks"]
            assert list(networks) == ["harbor-gym-public"]
            assert _reached(sb, targets) == []
    finally:
        loop.close()
        anyv4.close()


@pytest.mark.docker
def test_gym_10_two_sub_envs_and_another_network_cannot_reach_each_other(tmp_path, docker_client):
    # SPEC: GYM-10 — two episodes of a public task (two sub-envs) on the shared network: B serves on 0.0.0.0:8000
    # (reachable inside B itself), A cannot reach it; nor a container on another Docker network (the default bridge)
    steps = ["s1", "s2"]
    task = write_task(tmp_path, {"task.toml": toml(steps).replace(*PUBLIC), "tests/test.sh": grade("true")},
                      name="siblings")
    serve = "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 & sleep 1.5; echo IP=$(hostname -I)"
    cfg = config()
    other = docker_client.api.create_container(
        BASE_IMAGE, command=["python3", "-m", "http.server", "8000"], labels=dict([LABEL]),
        host_config=docker_client.api.create_host_config(network_mode="bridge", auto_remove=True))["Id"]
    try:
        docker_client.api.start(other)
        other_ip = docker_client.api.inspect_container(other)["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
        _wait_serving(other_ip, 8000)  # positive control: the host reaches it
        with Episode(load_task(task, cfg), cfg) as ep_b, Episode(load_task(task, cfg), cfg) as ep_a:
            ep_b.start()
            ep_a.start()
            tail = ep_b.run_turn(serve).record.output_tail
            ip_b = re.search(r"IP=(\S+)", tail).group(1)
            probe_b = ep_b.run_turn(f"python3 -c '{_PROBE}' {ip_b}:8000").record.output_tail
            assert f"REACHED {ip_b}:8000" in probe_b  # positive control: B's server answers on its address
            probe_a = ep_a.run_turn(f"python3 -c '{_PROBE}' {ip_b}:8000 {other_ip}:8000").record.output_tail
            assert f"blocked {ip_b}:8000" in probe_a and f"blocked {other_ip}:8000" in probe_a, probe_a
    finally:
        docker_client.api.remove_container(other, force=True)


@pytest.mark.docker
@pytest.mark.parametrize("public", [True, False], ids=["public", "no-network"])
def test_gym_10_a_compose_group_reaches_its_sidecar_but_no_host_service(public, tmp_path, docker_client):
    # SPEC: GYM-10, COMPOSE-1 — main of a compose group reaches its sidecar by name on the group's internal network,
    # but no host service: Docker gives even an internal network a gateway on the host, so every group bridge
    # (hgg-*) is dropped at the host's INPUT; a public group's egress is the shared, host-filtered network
    from harbor_gym.sandbox.compose import ComposeGroup
    from harbor_gym.task.compose import parse_compose_text

    env = tmp_path / "environment"
    env.mkdir()
    text = (f"services:\n  main:\n    image: {BASE_IMAGE}\n  web:\n    image: {BASE_IMAGE}\n"
            "    command: [\"python3\", \"-m\", \"http.server\", \"8000\"]\n")
    (env / "docker-compose.yaml").write_text(text)
    compose = parse_compose_text(text, path=env / "docker-compose.yaml")
    anyv4 = _Server("0.0.0.0")
    group = ComposeGroup(compose, settings=_settings(), network=public, name_hint="group-net",
                         sidecar_storage_mb=1024)
    try:
        group.start()
        bridge = docker_client.api.inspect_network(group.name)
        assert bridge["Internal"] and bridge["Options"]["com.docker.network.bridge.name"].startswith("hgg-")
        gateway = bridge["IPAM"]["Config"][0]["Gateway"]
        targets = [f"{ip}:{anyv4.port}" for ip in {*_host_addresses(), gateway}]
        socket.create_connection((gateway, anyv4.port), timeout=2).close()  # positive control from the host
        for _ in range(30):  # the sidecar's server needs a moment
            if _reached(group.main, ["web:8000"]):
                break
        assert _reached(group.main, ["web:8000"]) == ["web:8000"]
        assert _reached(group.main, targets) == []
        main_nets = docker_client.api.inspect_container(group.main.container_id)["NetworkSettings"]["Networks"]
        assert set(main_nets) == ({group.name, "harbor-gym-public"} if public else {group.name})
        web = docker_client.api.inspect_container(group.service("web").container_id)
        assert set(web["NetworkSettings"]["Networks"]) == {group.name}  # sidecars get no route out
        assert "size" in (web["HostConfig"].get("StorageOpt") or {})  # sidecars get the default storage bound
    finally:
        group.stop()
        anyv4.close()


@pytest.mark.docker
def test_gym_10_the_sandbox_layer_refuses_an_unfiltered_public_network(monkeypatch, docker_client):
    # SPEC: GYM-10 — defence in depth below the episode: a public DockerSandbox whose network cannot be filtered
    # (simulated) is refused at start unless its settings allow it; nothing is left behind
    from harbor_gym.errors import SandboxUnavailableError

    unfiltered = _netfilter.PublicNetwork("harbor-gym-public", None, "simulated: not root")
    monkeypatch.setattr(_netfilter, "public_network", lambda client: unfiltered)
    from harbor_gym.sandbox.docker_backend import DockerSandbox

    sb = DockerSandbox(SandboxSpec(image=BASE_IMAGE, network=True, name_hint="unfiltered"), _settings())
    with pytest.raises(SandboxUnavailableError) as err:
        sb.start()
    assert err.value.rule == "GYM-10" and "simulated" in str(err.value)
