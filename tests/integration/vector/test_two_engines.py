"""Issue 17 item 1: two Docker engines serve one `HarborVectorEnv` (``EnvConfig.engines``).

The second engine is a dockerd the test starts (`tests/private_engine.py`: its own data root, exec root and pidfile,
``--bridge=none``, ``--iptables=false``, at ``tcp://127.0.0.1:PORT``), holding no image at all: the task's image
reaches it from the host's engine through the API (save/load), and its lease reaper runs on it with its own socket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.vector import HarborVectorEnv
from private_engine import PrivateEngine, free_port
from task_folders import grade, toml, write_task

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="starting a dockerd needs root")]

HOST = "unix:///var/run/docker.sock"
DONE = "touch /app/done"


@pytest.fixture(scope="module")
def second(docker_client):
    engine = PrivateEngine(tcp_port=free_port())
    engine.start()
    try:
        yield engine
    finally:
        engine.remove()


@pytest.fixture
def task(tmp_path) -> Path:
    return write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": grade("[ -f /app/done ]")},
                      name="engines")


def _config(second, label, **over) -> EnvConfig:
    # the private engine's overlay2 on ext4 cannot bound a sandbox's size (GYM-10): no default storage bound
    return EnvConfig.coerce({"engines": [HOST, second.url], "engine_sockets": {second.url: second.socket_path},
                             "default_storage_mb": None, "labels": {"io.harbor-gym.test-engines": label},
                             "seed_retries": 1, **over})


def _labelled(client, label) -> list[dict]:
    return client.api.containers(all=True, filters={"label": f"io.harbor-gym.test-engines={label}"})


def _wait_gone(clients, label, bound_s) -> float:
    t0 = time.monotonic()
    while any(_labelled(c, label) for c in clients) and time.monotonic() - t0 < bound_s:
        time.sleep(0.5)
    return time.monotonic() - t0


# SPEC: GYM-2, GYM-10 (issue 17: episodes spread over both engines, least in flight first; the second engine gets the
# image through the API; nothing is left on either engine after close)
def test_two_engines_serve_one_vector_env(task, second, docker_client):
    label = uuid.uuid4().hex[:12]
    env = HarborVectorEnv(num_envs=8, path=task, config=_config(second, label), pool_size=0)
    client2 = second.client()
    try:
        env.reset(seed=0)
        on_host, on_second = _labelled(docker_client, label), _labelled(client2, label)
        # engine-side labels: each engine holds the sandboxes placed on it, four and four (least in flight)
        assert len(on_host) == 4 and len(on_second) == 4, (len(on_host), len(on_second))
        assert all(c["Labels"].get("io.harbor-gym.run") for c in on_second)
        _, reward, terminated, _, info = env.step([DONE] * 8)
        assert list(reward) == [1.0] * 8 and all(terminated)
        assert client2.images.get("harbor-gym/base:bookworm")  # copied, never pulled (no registry here)
    finally:
        env.close()
    assert _wait_gone([docker_client, client2], label, 15) < 15, "sandboxes left after close"
    client2.close()


COMPOSE = """\
services:
  main:
    image: debian:bookworm-slim
    command: ["sleep", "infinity"]
    working_dir: /app
  web:
    image: debian:bookworm-slim
    command: ["python3", "-m", "http.server", "8000", "--directory", "/srv"]
    volumes:
      - ./site:/srv:ro
"""


def _only_on(second, docker_client, label) -> None:
    """Every labelled container of ``label`` is on the second engine (pinned there: the host's engine is out)."""
    assert _labelled(second.client(), label) and not _labelled(docker_client, label)


# SPEC: GYM-2, COMPOSE-1, GYM-10 (issue 17: a Dockerfile is built on the engine the episode runs on, its base image
# copied there; a compose group runs there with its read-only task-folder bind uploaded, never bind-mounted from this
# host; warm pools are per engine; gc of the remote engine keeps a live run by its reaper's leases)
def test_builds_compose_groups_pools_and_gc_on_the_remote_engine(tmp_path, second, docker_client):
    from harbor_gym.env import HarborEnv
    from harbor_gym.sandbox.gc import collect_garbage
    from harbor_gym.sandbox.pool import close_pools

    label = uuid.uuid4().hex[:12]
    built = write_task(tmp_path, {
        "task.toml": toml(["s1"]).replace('docker_image = "debian:bookworm-slim"\n', ""),
        "environment/Dockerfile": "FROM debian:bookworm-slim\nRUN mkdir -p /app && echo built > /app/built\n",
        "tests/test.sh": grade("grep -q built /app/built && [ -f /app/done ]")}, name="built")
    composed = write_task(tmp_path, {
        "task.toml": toml(["s1"]).replace('docker_image = "debian:bookworm-slim"\n', ""),
        "environment/docker-compose.yaml": COMPOSE, "environment/site/index.html": "hello from the task folder\n",
        "tests/test.sh": grade("python3 -c \"import urllib.request as u; "
                               "assert b'hello' in u.urlopen('http://web:8000/').read()\"")}, name="composed")
    # only the second engine serves (the first is named but unreachable), so every sandbox must be made there
    cfg = EnvConfig.coerce({"engines": ["tcp://127.0.0.1:9", second.url], "engine_sockets": {
        second.url: second.socket_path}, "default_storage_mb": None, "unfiltered_network": "allow",
        "labels": {"io.harbor-gym.test-engines": label}, "seed_retries": 2, "pool_size": 1})
    client2 = second.client()
    try:
        for path, action in ((built, DONE), (composed, ":")):
            env = HarborEnv(path, config=cfg)
            try:
                env.reset(seed=0)
                _only_on(second, docker_client, label)
                _, reward, terminated, _, info = env.step(action)
                assert reward == 1.0 and terminated, info["turn"]
                if path == composed:  # the bind was uploaded: no mount of a host path on the remote engine
                    for c in _labelled(client2, label):
                        mounts = client2.api.inspect_container(c["Id"])["Mounts"]
                        assert not [m for m in mounts if m.get("Type") == "bind"], mounts
                    # gc of the remote engine while the run is live: its lease (in that engine's reaper) keeps it
                    report = collect_garbage(client=client2)
                    assert not report.containers and report.kept_live
            finally:
                env.close()
        assert client2.images.list(filters={"label": "io.harbor-gym.cache=build"})  # built on the second engine
    finally:
        client2.close()
        close_pools()  # warm pools are process-wide: their ready sandboxes stay until this (README)
    assert _wait_gone([second.client()], label, 30) < 30


TRAINER = textwrap.dedent("""
    import sys, time
    from harbor_gym.config import EnvConfig
    from harbor_gym.vector import HarborVectorEnv
    task, host, url, sock, label = sys.argv[1:6]
    cfg = EnvConfig(engines=[host, url], engine_sockets={url: sock}, default_storage_mb=None, lease_ttl_s=10,
                    labels={"io.harbor-gym.test-engines": label})
    env = HarborVectorEnv(num_envs=4, path=task, config=cfg, pool_size=0)
    env.reset(seed=0)
    print("READY", flush=True)
    time.sleep(600)
""")


# SPEC: GYM-10 (P3 across engines: a SIGKILLed trainer's sandboxes disappear from both engines within the lease
# bound, lease_ttl_s + 20 s, removed by each engine's own reaper)
def test_sigkilled_trainer_is_reaped_on_both_engines(task, second, docker_client, tmp_path):
    label = uuid.uuid4().hex[:12]
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, str(script), str(task), HOST, second.url, second.socket_path, label],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    client2 = second.client()
    try:
        assert proc.stdout.readline().strip() == "READY"
        assert _labelled(docker_client, label) and _labelled(client2, label)  # on both engines
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        took = _wait_gone([docker_client, client2], label, 60)
        print(f"both engines clean {took:.1f} s after the SIGKILL (bound {10 + 20} s)")
        assert not _labelled(docker_client, label) and not _labelled(client2, label)
        assert took <= 10 + 20 + 5, f"reaped only after {took:.1f} s"
    finally:
        if proc.poll() is None:
            proc.kill()
        client2.close()


# SPEC: GYM-2, STOP-8 (issue 17: an engine that dies mid-run gives outages naming it; the run goes on, on the other)
def test_killed_engine_gives_named_outages_and_the_run_goes_on(task, second, docker_client, caplog):
    label = uuid.uuid4().hex[:12]
    cfg = _config(second, label)
    env = HarborVectorEnv(num_envs=4, path=task, config=cfg, pool_size=0)
    try:
        env.reset(seed=0)
        assert len(_labelled(second.client(), label)) == 2
        second.kill()
        _, reward, terminated, truncated, info = env.step([DONE] * 4)
        results = info["final_info"]["episode_result"]
        outages = [r for r in results if r.failure_kind == "harbor_gym:sandbox_outage"]
        assert len(outages) == 2 and sorted(reward) == [0.0, 0.0, 1.0, 1.0]
        for r in outages:
            assert f"engine {second.url} does not answer" in r.failure_message, r.failure_message
            assert r.retryable and not r.graded  # an outage: ungraded, retryable (STOP-8)
        # the run goes on: every episode from here on lands on the host's engine and passes
        for _ in range(2):
            _, reward, terminated, _, info = env.step([DONE] * 4)
            assert list(reward) == [1.0] * 4
            assert len(_labelled(docker_client, label)) == 4
        status = {s["url"]: s for s in env_status(cfg)}
        assert status[second.url]["in_service"] is False and status[HOST]["in_service"] is True
    finally:
        env.close()
    assert _wait_gone([docker_client], label, 15) < 15
    # the process's lease keeps renewing in the dead engine (it may come back holding sandboxes), warning once
    from harbor_gym.sandbox._reaper import EngineLease
    from harbor_gym.sandbox.lease import process_lease

    dead = [r for r in process_lease().remotes if isinstance(r, EngineLease) and r._engine_name == second.url]
    assert len(dead) == 1
    caplog.clear()
    with caplog.at_level("DEBUG", logger="harbor_gym.sandbox"):
        for _ in range(3):
            dead[0].renew()
    failed = [r for r in caplog.records if f"renewal in engine {second.url} failed" in r.getMessage()]
    assert len(failed) >= 3 and [r.levelname for r in failed].count("WARNING") <= 1, failed
    second.remove()  # the module's last test: the dead engine's folder goes now


def env_status(cfg: EnvConfig) -> list[dict]:
    """The process's engine set of ``cfg`` (shared by every env of that config), per engine."""
    from harbor_gym.sandbox.engines import engine_set

    return engine_set(cfg.engines, cfg.engine_sockets, probe_interval_s=cfg.engine_probe_interval_s).status()
