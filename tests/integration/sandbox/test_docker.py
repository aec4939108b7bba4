"""Docker-only guarantees: a container killed mid-command, refusal of unenforceable limits (LOAD-24), init-fast
stop, engine round trips per call, labels and names, clean-up on failed or interrupted starts, at interpreter exit
and after the host process is SIGKILLed (the lease)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from harbor_gym import sandbox
from harbor_gym.errors import ImageError, SandboxError, SandboxUnavailableError
from harbor_gym.sandbox import DockerSandbox, SandboxSpec, count_requests
from harbor_gym.sandbox.docker_backend import TTL_LABEL

pytestmark = pytest.mark.docker

BASE_IMAGE = "harbor-gym/base:bookworm"


def _exists(client, name: str) -> bool:
    import docker.errors

    try:
        client.containers.get(name)
        return True
    except docker.errors.NotFound:
        return False


def _state(client, name: str) -> str | None:
    """The container's state as the engine lists it (``removing`` once a removal started), None once gone."""
    for c in client.api.containers(all=True, filters={"name": name}):
        if f"/{name}" in (c.get("Names") or []):
            return c["State"]
    return None


def _wait_gone(client, name: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _exists(client, name):
            return True
        time.sleep(0.3)
    return not _exists(client, name)


def test_container_killed_mid_command_raises_naming_the_sandbox(settings_with, docker_client):
    with DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="killed"), settings_with()) as sb:
        threading.Timer(1.0, lambda: docker_client.api.kill(sb.container_id)).start()
        t0 = time.monotonic()
        with pytest.raises(SandboxError) as err:
            sb.exec("sleep 30", timeout=60)
        assert time.monotonic() - t0 < 8
        assert sb.name in str(err.value)


@pytest.fixture
def slow_upgrade_reply(monkeypatch):
    """The client reads each HTTP reply's headers 0.5 s late (a busy trainer process): a fast command's whole
    output then arrives with the exec's ``101 UPGRADED`` headers, into the SDK's buffered reader."""
    import http.client

    begin = http.client.HTTPResponse.begin

    def late(self):
        time.sleep(0.5)
        return begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late)


def test_gym_4_output_that_arrives_with_the_upgrade_headers_is_kept(settings_with, slow_upgrade_reply):
    # SPEC: GYM-4 — a command's exit code and output are recorded, however fast it ran (it once came back as
    # "exec could not start the command" with nothing: the SDK's reader had taken the pid line and trailer)
    with DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="fast"), settings_with()) as sb:
        for _ in range(3):
            res = sb.exec("echo hello; echo oops >&2; exit 3", timeout=30)
            assert (res.exit_code, res.stdout, res.stderr) == (3, "hello\n", "oops\n")


def test_own_short_commands_keep_output_that_arrives_with_the_headers(docker_client, slow_upgrade_reply):
    from harbor_gym.sandbox._docker_exec import read_all

    # SPEC: GYM-10 — the reaper's engine check reads its answer this way: a lost "ok" would refuse a good engine
    box = docker_client.containers.run(BASE_IMAGE, ["sleep", "60"], detach=True, network_mode="none", remove=True,
                                       labels={"harbor-gym.test": "read-all"})
    try:
        exec_id = docker_client.api.exec_create(box.id, ["sh", "-c", "echo ok; echo warn >&2"])["Id"]
        assert read_all(docker_client.api, exec_id, timeout=30) == (b"ok\n", b"warn\n")
    finally:
        box.remove(force=True)


def test_gym_4_stdin_a_command_does_not_read_never_holds_the_exec_past_its_timeout(settings_with):
    # SPEC: GYM-4 — a command's bound holds whatever it does with its stdin (the send once blocked until the SDK's
    # 120 s socket timeout, then raised a retryable error); one that stops reading just ends
    big = b"x" * (8 << 20)
    with DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="stdin"), settings_with()) as sb:
        t0 = time.monotonic()
        res = sb.exec("sleep 60", timeout=2, stdin=big)
        assert res.timed_out and time.monotonic() - t0 < 15, res
        res = sb.exec("head -c 5", timeout=30, stdin=big)
        assert (res.exit_code, res.stdout, res.timed_out) == (0, "xxxxx", False), res


def test_load_24_unenforceable_limits_are_refused_at_start(docker_client, settings_with):
    # SPEC: LOAD-24 — this engine is CPU-only: refused, never silently dropped (storage is bounded: GYM-10,
    # tests/hostile/test_limits_network.py)
    sb = DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="refuse", gpus=1), settings_with())
    with pytest.raises(SandboxUnavailableError) as err:
        sb.start()
    assert err.value.rule == "LOAD-24" and err.value.field == "gpus"
    assert not _exists(docker_client, sb.name)


def test_container_has_labels_name_init_and_stops_fast(settings_with, docker_client):
    spec = SandboxSpec(image=BASE_IMAGE, name_hint="My Task/1", labels={"x.test": "1"})
    with sandbox.open(spec, backend="docker", settings=settings_with()) as sb:
        assert sb.backend == "docker" and sb.name.startswith("hg-My-Task-1-")
        attrs = docker_client.api.inspect_container(sb.container_id)
        labels = attrs["Config"]["Labels"]
        assert labels["io.harbor-gym.managed"] == "true" and labels["io.harbor-gym.run"] == sb.run_id
        assert labels["x.test"] == "1" and TTL_LABEL in labels
        assert attrs["HostConfig"]["Init"] is True and attrs["HostConfig"]["NetworkMode"] == "none"
        t0 = time.monotonic()
        sb.stop()
        assert time.monotonic() - t0 < 2.0
    assert _wait_gone(docker_client, sb.name, 5)


def test_engine_round_trips_per_call(settings_with, tmp_path):
    import docker

    client = docker.from_env()
    counter = count_requests(client)
    with DockerSandbox(SandboxSpec(image=BASE_IMAGE, workdir="/app"), settings_with(), client=client) as sb:
        counter.reset()
        sb.exec("echo hi", timeout=10)
        assert counter.count == 2, counter.paths  # exec create + attached start, exit code from the trailer
        counter.reset()
        sb.put_bytes(b"x", "/app/a/b.txt")
        assert counter.count == 1, counter.paths
        counter.reset()
        assert sb.read_file("/app/a/b.txt", max_bytes=10) == b"x"
        assert counter.count == 1, counter.paths
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f").write_text("f")
        counter.reset()
        sb.put(tmp_path / "d", "/app/d", owner="1000:1000")
        assert counter.count == 1, counter.paths
        assert sb.engine_requests >= 7
    client.close()


def test_failed_start_leaves_nothing(settings_with, docker_client):
    spec = SandboxSpec(image="no-such-image-for-harbor-gym:1", name_hint="missing")
    with pytest.raises(ImageError) as err:
        sandbox.open(spec, backend="docker", settings=settings_with(pull_policy="never"))
    assert "no-such-image-for-harbor-gym:1" in str(err.value)


def test_keyboard_interrupt_during_start_removes_the_container(settings_with, docker_client, monkeypatch):
    import docker

    client = docker.from_env()
    sb = DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="ctrlc"), settings_with(), client=client)

    def interrupted_start(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(client.api, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        sb.start()
    assert _wait_gone(docker_client, sb.name, 5), "a Ctrl-C during start left the container"
    client.close()


_CHILD = textwrap.dedent(
    """
    import sys, time
    from harbor_gym.sandbox import DockerSandbox, SandboxSpec, SandboxSettings
    sb = DockerSandbox(SandboxSpec(image="harbor-gym/base:bookworm", name_hint="child"),
                       SandboxSettings(pull_policy="never", lease_ttl_s=float(sys.argv[1])))
    sb.start()
    print(sb.name, flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)
    """
)


def test_interpreter_exit_removes_sandboxes_not_stopped(docker_client):
    out = subprocess.run([sys.executable, "-c", _CHILD, "60", "exit"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    name = out.stdout.strip()
    assert name.startswith("hg-child-")
    assert _wait_gone(docker_client, name, 5), "atexit did not remove the sandbox"


def test_sigkilled_host_process_leaves_nothing_after_the_lease_ttl(docker_client):
    # SPEC: GYM-10 — removed by the engine's reaper within lease_ttl_s + 20 s (here 3 s + poll + removal)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, "3", "hang"], stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("hg-child-")
        assert _exists(docker_client, name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        deadline = t0 + 3 + 20
        while _state(docker_client, name) not in (None, "removing"):  # gone, or being removed at the reaper's request
            assert time.monotonic() < deadline, "the container outlived its host's SIGKILL"
            time.sleep(0.3)
        assert _wait_gone(docker_client, name, 300), "the engine did not finish removing the container"
    finally:
        if proc.poll() is None:
            proc.kill()


def _reaper_state(client) -> str | None:
    import docker.errors

    from harbor_gym.sandbox._reaper import REAPER_NAME

    try:
        return client.api.inspect_container(REAPER_NAME)["State"]["Status"]
    except docker.errors.NotFound:
        return None


def test_gym_10_the_reaper_is_not_a_sandbox_and_comes_back_when_removed_or_stopped(settings_with, docker_client):
    # SPEC: GYM-10 — the reaper carries neither the managed label nor EnvConfig.labels; when it is removed the next
    # renewal recreates it, when it is stopped the next check starts it, and a live run's sandbox survives both
    from harbor_gym.sandbox._reaper import REAPER_LABEL, REAPER_NAME
    from harbor_gym.sandbox.base import MANAGED_LABEL

    settings = settings_with(lease_ttl_s=5.0, labels={"io.harbor-gym.test": "reaper"})
    with DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="reaper"), settings) as sb:
        labels = docker_client.api.inspect_container(REAPER_NAME)["Config"]["Labels"]
        assert set(labels) == {REAPER_LABEL}, labels
        assert MANAGED_LABEL not in labels and "io.harbor-gym.test" not in labels
        docker_client.api.remove_container(REAPER_NAME, force=True)
        deadline = time.monotonic() + 180  # a renewal within 1.25 s; the rest is the engine's own (slow) work
        while _reaper_state(docker_client) != "running":
            assert time.monotonic() < deadline, "the removed reaper was not recreated by the next renewal"
            time.sleep(0.2)
        docker_client.api.stop(REAPER_NAME, timeout=1)
        deadline = time.monotonic() + 15 + 180  # the next check (15 s), then the engine's own work
        while _reaper_state(docker_client) != "running":
            assert time.monotonic() < deadline, "the stopped reaper was not started again"
            time.sleep(0.5)
        time.sleep(6)  # past the TTL: the renewing run's sandbox is kept by the new reaper
        assert sb.is_alive()

