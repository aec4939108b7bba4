"""Podman as a backend (issue 17 item 2), beyond the contract suite (which runs on rootful and rootless podman):
GYM-10's network on podman's own bridge, rootless podman end to end with its refusals, and the supervisor of
harbor_gym's own service keeping it while the reaper still has work."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harbor_gym.sandbox import SandboxSpec, _podman_service
from harbor_gym.sandbox._podman import engine_of
from harbor_gym.sandbox._podman_net import BRIDGE_IFACE, PUBLIC_NETWORK
from harbor_gym.sandbox.podman_backend import PodmanSandbox


pytestmark = pytest.mark.podman

REPO = Path(__file__).resolve().parents[3]
BASE_IMAGE = "harbor-gym/base:bookworm"

_CONNECT = """
import socket, sys
for host, port in [tuple(t.rsplit(':', 1)) for t in sys.argv[1:]]:
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((host, int(port))); print(host, 'connected')
    except OSError as e:
        print(host, 'blocked', type(e).__name__)
    finally:
        s.close()
"""


def _host_address() -> str:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # sends nothing: only picks this machine's own source address
        return probe.getsockname()[0]
    finally:
        probe.close()


@pytest.fixture
def host_listener():
    """A TCP service of this host on 0.0.0.0 (what a sandbox must not reach); yields its port."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    stop = threading.Event()

    def serve():
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


# SPEC: GYM-10 (issue 17 item 2): a public podman sandbox reaches no host service and no sibling; Docker's bridge
# is left alone (podman's networks never take its names)
def test_gym_10_public_podman_sandbox_reaches_neither_host_nor_sibling(podman_rootful, host_listener,
                                                                       settings_with):
    docker_bridge = Path("/sys/class/net/hg-public0")
    had_docker_bridge = docker_bridge.exists()
    settings = settings_with()
    a = PodmanSandbox(SandboxSpec(image=BASE_IMAGE, network=True, name_hint="net-a"), settings, client=podman_rootful)
    b = PodmanSandbox(SandboxSpec(image=BASE_IMAGE, network=True, name_hint="net-b"), settings, client=podman_rootful)
    try:
        a.start()
        b.start()
        b.exec("nohup python3 -m http.server 8000 >/dev/null 2>&1 &", timeout=10)
        nets = podman_rootful.api.inspect_container(b.container_id)["NetworkSettings"]["Networks"]
        sibling = nets[PUBLIC_NETWORK]["IPAddress"]
        gateway = nets[PUBLIC_NETWORK]["Gateway"]
        wait = ("import socket, time\nfor _ in range(100):\n    try:\n        socket.create_connection(('127.0.0.1', "
                "8000), 2); break\n    except OSError: time.sleep(0.1)\nelse: raise SystemExit(1)")
        assert b.exec(["python3", "-c", wait], timeout=30).ok  # the sibling's server does listen
        port = host_listener
        r = a.exec(["python3", "-c", _CONNECT, f"{_host_address()}:{port}", f"{gateway}:{port}",
                    "127.0.0.1:" + str(port), f"{sibling}:8000"], timeout=40)
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert all(v.startswith("blocked") for v in lines.values()), r.stdout
        assert len(lines) == 4 and Path(f"/sys/class/net/{BRIDGE_IFACE}").exists()
    finally:
        a.stop()
        b.stop()
    assert docker_bridge.exists() == had_docker_bridge, "Docker's hg-public0 bridge changed"


# SPEC: LOAD-24, GYM-10 (issue 17 item 2): on rootless podman (cgroup v1) the default memory bound is refused at
# seed, naming it; with the bounds lifted an episode runs and scores; pids_limit is said to be not applied
def test_load_24_rootless_podman_refuses_limits_at_seed_then_runs(podman_rootless):
    engine = engine_of(podman_rootless)
    assert engine.rootless and not engine.can_limit("memory_mb")
    program = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING)
logging.getLogger("harbor_gym.sandbox").setLevel(logging.INFO)  # the one line saying which podman it uses
from harbor_gym import HarborEnv
from harbor_gym.agents import Oracle
from harbor_gym.errors import SeedRefusedError
out = {}
env = HarborEnv("envs/cake", config={"backend": "podman"})
try:
    env.reset(seed=0)
except SeedRefusedError as exc:
    out["refused"] = [exc.rule, exc.field, str(exc)]
finally:
    env.close()
env = HarborEnv("envs/cake", config={"backend": "podman", "default_memory_mb": None, "default_storage_mb": None})
try:
    env.reset(seed=0)
    out["rewards"] = [env.step(Oracle())[1] for _ in range(2)]
finally:
    env.close()
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CONTAINER_HOST": engine.url, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    rule, field, message = out["refused"]
    assert (rule, field) == ("LOAD-24", "EnvConfig.default_memory_mb"), message
    assert "rootless podman" in message and "default_memory_mb=None" in message
    assert out["rewards"] == [1.0, 1.0]
    assert "pids_limit=4096 is not applied" in done.stderr
    assert "sandbox backend podman: rootless podman" in done.stderr and "(CONTAINER_HOST)" in done.stderr


# issue 17 item 2: harbor_gym's own service stops once no process uses it, but not while something leased is left
# for the reaper (a SIGKILLed trainer's sandboxes)
def test_own_service_outlives_its_users_only_while_leased_resources_remain(podman_rootful, tmp_path):
    folder = Path("/run/harbor-gym") / f"podman-test-{os.getpid()}"
    folder.mkdir(parents=True, mode=0o700)
    sock = folder / "podman.sock"
    users = os.open(folder / _podman_service.USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(users, fcntl.LOCK_SH)
    supervisor = subprocess.Popen([sys.executable, _podman_service.__file__, "--socket", str(sock)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
    api = podman_rootful.api
    cid = None
    try:
        deadline = time.monotonic() + 60
        while not _podman_service.answers(str(sock)):
            assert time.monotonic() < deadline and supervisor.poll() is None, "the service did not start"
            time.sleep(0.2)
        cid = api.create_container(BASE_IMAGE, command=["true"], labels={
            _podman_service.LEASE_LABEL: "dead-run", _podman_service.TTL_LABEL: "600"})["Id"]  # never started
        os.close(users)
        users = -1
        time.sleep(3 * _podman_service.POLL_S)
        assert supervisor.poll() is None, "the service stopped while a leased container was left"
        api.remove_container(cid, force=True)
        cid = None
        supervisor.wait(30)  # no user, nothing leased: it stops the service and ends
        assert not sock.exists()
    finally:
        if users >= 0:
            os.close(users)
        if cid is not None:
            api.remove_container(cid, force=True)
        if supervisor.poll() is None:
            supervisor.terminate()
            supervisor.wait(30)
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
