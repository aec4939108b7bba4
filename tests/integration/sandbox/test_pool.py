"""Warm pools on a real engine: pristine hand-outs, the bound, background refill and teardown, close, leases."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from harbor_gym import HarborEnv
from harbor_gym.errors import SandboxError
from harbor_gym.config import host_settings
from harbor_gym.sandbox import MANAGED_LABEL, RUN_LABEL, SandboxSettings, SandboxSpec, lease as leases
from harbor_gym.sandbox.docker_backend import TTL_LABEL
from harbor_gym.sandbox.pool import PooledSandbox, SandboxPool, close_pools, get_pool, pool_factory, pools

pytestmark = pytest.mark.docker

BASE_IMAGE = "harbor-gym/base:bookworm"


def base_settings(**changes) -> SandboxSettings:
    """Host aliases, pull policy never, a short lease TTL (no import of a conftest: names collide across folders)."""
    hs = host_settings()
    return SandboxSettings(pull_policy="never", image_aliases=dict(hs.image_aliases),
                           rootfs_aliases=dict(hs.rootfs_aliases), lease_ttl_s=30.0, **changes)

#: Unique to this test process: the leak checks count only these containers.
LABEL = ("io.harbor-gym.test-pool", uuid.uuid4().hex[:12])
SETTINGS = base_settings(labels=dict([LABEL]))
SPEC = SandboxSpec(image=BASE_IMAGE, workdir="/app", name_hint="pool")


def labelled(client) -> list[str]:
    """Names of this process's pool containers (raw listing: no per-container inspect racing the reaper)."""
    return [c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": "=".join(LABEL)})]


def wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture
def pool():
    p = SandboxPool(SPEC, backend="docker", settings=SETTINGS, size=2)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _no_leaks(docker_client):
    yield
    close_pools()
    assert wait_until(lambda: labelled(docker_client) == [], 15), labelled(docker_client)


def test_pool_sandboxes_are_pristine(pool):
    # SPEC: GYM-2 — a claimed sandbox was never used: no file of an earlier claim, never the same sandbox twice.
    assert pool.fill(timeout=60) == 2
    names = []
    for _ in range(5):
        sb = pool.claim()
        assert isinstance(sb, PooledSandbox)
        res = sb.exec("ls /app/used 2>/dev/null && echo dirty || echo clean; touch /app/used; hostname",
                      timeout=10)
        assert res.stdout.split()[0] == "clean"
        names.append(sb.name)
        sb.stop()
        assert sb.state.value == "stopped"  # retired at once; the reaper removes it in the background
        with pytest.raises(SandboxError):
            sb.start()
    assert len(set(names)) == 5
    assert pool.stats.warm_claims >= 2 and pool.stats.retired == 5


def test_pool_never_exceeds_its_bound(pool, docker_client):
    # The pool keeps at most `size` pristine sandboxes, whatever the claim rate.
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(pool.ready_count + pool.starting_count)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        pool.fill(timeout=60)
        held = [pool.claim() for _ in range(4)]
        for sb in held:
            sb.stop()
        pool.fill(timeout=60)
        assert pool.drain(timeout=30)
    finally:
        stop.set()
        watcher.join()
    assert max(seen) <= 2 and pool.stats.max_pool <= 2
    # On the engine: exactly the pool's ready sandboxes remain (every retired one was removed).
    assert wait_until(lambda: len(labelled(docker_client)) == 2, 15)


def test_close_removes_them_all(pool, docker_client):
    # close() removes ready, starting and handed-out sandboxes; a claim after close is refused.
    pool.fill(timeout=60)
    held = pool.claim()  # handed out, still in use
    assert held.exec("true", timeout=10).ok
    assert len(labelled(docker_client)) >= 2
    pool.close()
    assert labelled(docker_client) == []
    assert not held.is_alive()
    with pytest.raises(SandboxError):
        pool.claim()
    pool.close()  # idempotent


def test_dead_ready_sandbox_is_discarded(pool, docker_client):
    # A ready sandbox that died is health-checked away, never handed out.
    pool.fill(timeout=60)
    victim = pool._ready[0]
    docker_client.containers.get(victim.container_id).kill()
    assert wait_until(lambda: not victim.is_alive(), 10)
    got = [pool.claim() for _ in range(2)]
    assert all(sb.is_alive() for sb in got)
    assert victim.name not in {sb.name for sb in got}
    assert pool.stats.discarded >= 1
    for sb in got:
        sb.stop()


def test_empty_pool_starts_its_own(docker_client):
    # With nothing ready the claim starts a sandbox itself (cold) and still hands out a running, pristine one.
    p = SandboxPool(SPEC, backend="docker", settings=SETTINGS, size=0)
    try:
        sb = p.claim()
        assert not sb.warm and sb.is_alive()
        assert sb.exec("echo ok", timeout=10).stdout.strip() == "ok"
        sb.stop()
        assert p.stats.cold_claims == 1 and p.starting_count == 0
    finally:
        p.close()


def test_pool_sandboxes_hold_leases(pool, docker_client):
    # Pool sandboxes are bound to the process lease like any other (a SIGKILLed host leaves nothing past the TTL).
    pool.fill(timeout=60)
    for name in labelled(docker_client):
        container = docker_client.containers.get(name)
        assert container.labels[MANAGED_LABEL] == "true"
        assert container.labels[RUN_LABEL] == leases.process_lease().run_id
        assert float(container.labels[TTL_LABEL]) == SETTINGS.lease_ttl_s
    assert all(id(sb) in leases._live for sb in pool._ready)


def test_prepare_runs_ahead_and_on_cold_claims():
    # A pool's prepare step runs before a sandbox counts as ready (and on a cold claim before it is handed out).
    def prepare(sb):
        sb.exec("echo prepared > /app/prep", timeout=10)

    p = get_pool(SPEC, backend="docker", settings=SETTINGS, size=1, prepare=prepare, prepare_key="prep-v1")
    try:
        assert p.fill(timeout=60) == 1
        warm = p.claim()
        cold = p.claim()
        for sb in (warm, cold):
            assert sb.exec("cat /app/prep", timeout=10).stdout.strip() == "prepared"
            sb.stop()
        assert warm.warm and not cold.warm
        assert get_pool(SPEC, backend="docker", settings=SETTINGS, size=1) is not p  # other key, other pool
    finally:
        close_pools()


def test_env_reset_claims_warm_and_tears_down_in_background(envs_dir, docker_client):
    # GYM-2 with a pool: reset takes a ready sandbox; the previous episode's sandbox goes to the reaper.
    config = {"backend": "docker", "labels": dict([LABEL]), "pool_size": 2}
    factory = pool_factory(config)
    env = HarborEnv(envs_dir / "cake", config=config, sandbox_factory=factory)
    try:
        env.reset()
        first = env._episode.sandbox
        (p,) = [q for q in pools() if q.spec.name_hint == "cake"]
        assert p.fill(timeout=60) == 2
        env.reset()
        second = env._episode.sandbox
        assert second.warm and second.name != first.name
        assert first.state.value == "stopped"
        assert wait_until(lambda: first.name not in labelled(docker_client), 15)
    finally:
        env.close()
        close_pools()


def test_pool_size_rejects_negative():
    from harbor_gym.errors import ConfigError

    with pytest.raises(ConfigError):
        SandboxPool(SPEC, backend="docker", settings=SETTINGS, size=-1)
