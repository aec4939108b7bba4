"""P2 "a run always ends" and P3 "everything it started is gone", with a sick Docker engine: restarted in the
middle of a turn, unreachable at reset. Runs on a private engine the test starts itself (its own socket, data root
and exec root, no bridge, no iptables), so other tests and the host's engine are untouched; the base image is
copied into it once per module."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from harbor_gym.episode import Episode
from harbor_gym.errors import SeedError
from harbor_gym.sandbox.base import SandboxSettings
from harbor_gym.sandbox.docker_backend import DockerSandbox
from harbor_gym.task import load_task

from .helpers import BASE_IMAGE, LABEL_FILTER, config, grade, toml, write_task
from private_engine import PrivateEngine

pytestmark = [pytest.mark.docker, pytest.mark.skipif(os.geteuid() != 0, reason="starting a dockerd needs root")]

OUTAGE = "harbor_gym:sandbox_outage"


@pytest.fixture(scope="module")
def engine(docker_client):
    root = Path(tempfile.mkdtemp(prefix="hg-sick-", dir="/tmp"))
    eng = PrivateEngine(root)
    eng.start()
    try:
        client = eng.client()
        client.images.load(b"".join(docker_client.images.get(BASE_IMAGE).save(named=True)))
        client.close()
        yield eng
    finally:
        eng.remove()


def _factory(client, cfg):
    def make(spec):
        sb = DockerSandbox(spec, SandboxSettings.from_config(cfg), client=client)
        sb.start()
        return sb

    return make


def _task(tmp_path):
    return write_task(tmp_path, {"task.toml": toml(["s1", "s2"], agent_timeout=60),
                                 "tests/test.sh": grade("[ -f /app/done ]")}, name="sick")


def _labelled(eng) -> list:
    client = eng.client()
    try:
        return client.api.containers(all=True, filters={"label": LABEL_FILTER})
    finally:
        client.close()


# SPEC: STOP-8, GYM-7, GYM-12 (P2/P3: an engine restarted mid-turn ends the turn truncated and retryable, not
# agent-caused; nothing is left)
def test_p2_engine_restarted_in_the_middle_of_a_turn(tmp_path, engine):
    cfg = config(default_storage_mb=None)  # the private engine's overlay2 on ext4 cannot bound size (GYM-10)
    client = engine.client()
    ep = Episode(load_task(_task(tmp_path), cfg), cfg, sandbox_factory=_factory(client, cfg))
    restarted = threading.Event()

    def restart():
        time.sleep(2)
        engine.stop()
        engine.start()
        restarted.set()

    try:
        ep.start()
        worker = threading.Thread(target=restart)
        worker.start()
        t0 = time.monotonic()
        result = ep.run_turn("sleep 30; touch /app/done")
        took = time.monotonic() - t0
        worker.join(90)
    finally:
        ep.close()
        client.close()
    assert restarted.is_set()
    assert result.truncated and not result.terminated and took < 25
    assert result.record.failure_kind == OUTAGE and result.record.reward is None
    assert not result.record.agent_caused and result.record.outage_cause is None  # GYM-12: never the agent's
    assert result.episode is not None and result.episode.retryable and not result.episode.graded
    end = time.monotonic() + 30
    while _labelled(engine) and time.monotonic() < end:
        time.sleep(0.5)
    assert _labelled(engine) == []  # the engine is back and holds nothing of ours


# SPEC: GYM-2 (P2/P3: an engine unreachable at reset is a clear, retryable SeedError, fast; once back, all works)
def test_p2_engine_unreachable_at_reset(tmp_path, engine):
    cfg = config(seed_retries=1, default_storage_mb=None)  # see above: no storage bound on this engine
    task = load_task(_task(tmp_path), cfg)
    engine.stop()
    import docker

    dead = docker.DockerClient(base_url=engine.sock, version="1.41", timeout=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(SeedError) as info:
            with Episode(task, cfg, sandbox_factory=_factory(dead, cfg)) as ep:
                ep.start()
        took = time.monotonic() - t0
    finally:
        engine.start()
    err = info.value
    assert err.retryable and took < 20
    assert "does not answer" in str(err) and "sick" in str(err)
    # once it is back: an episode runs and nothing is left
    live = engine.client()
    try:
        with Episode(task, cfg, sandbox_factory=_factory(live, cfg)) as ep:
            ep.start()
            assert ep.run_turn("touch /app/done").record.reward == 1.0
    finally:
        live.close()
        dead.close()
    assert _labelled(engine) == []
