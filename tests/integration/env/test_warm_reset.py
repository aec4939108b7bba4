"""Warm resets: with ``pool_size > 0`` the episode's seeding (GYM-2) runs ahead on the pool's sandboxes, and a reset
only claims one. Same seeding, same scores, pristine hand-outs, failures never handed out, nothing left behind."""

from __future__ import annotations

import shutil
import time

import pytest
from env_helpers import DOCKER, ENVS, TEST_LABEL, solution_scripts

import harbor_gym
from harbor_gym import HarborEnv
from harbor_gym.episode import Episode
from harbor_gym.errors import SandboxError, SeedError
from harbor_gym.sandbox.pool import PoolFactory, close_pools, pools

pytestmark = pytest.mark.docker

POOLED = {**DOCKER, "pool_size": 2}

#: What GYM-2 seeding leaves (FMT-10 files with owner and mode, the /logs folders, the staging folder); no times.
SEED_PROBE = (
    "stat -c '%n %U:%G %a %s' /app /app/menu.txt /logs/agent /logs/verifier /logs/artifacts /tests /.harbor_gym; "
    "md5sum /app/menu.txt; ls -A /app"
)


def labelled(client) -> list[str]:
    return [c["Names"][0].lstrip("/")
            for c in client.api.containers(all=True, filters={"label": "=".join(TEST_LABEL)})]


def wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def cake_pool():
    (pool,) = [p for p in pools() if p.spec.name_hint == "cake"]
    return pool


@pytest.fixture(autouse=True)
def _nothing_left(docker_client):
    close_pools()
    yield
    close_pools()
    assert wait_until(lambda: labelled(docker_client) == [], 15), labelled(docker_client)


def _probe(env: HarborEnv) -> str:
    sb = env._episode.sandbox
    return sb.exec(["bash", "-c", SEED_PROBE], timeout=10, user="root").stdout


# SPEC: GYM-2, FMT-10
def test_prepared_sandbox_is_seeded_exactly_like_a_cold_one():
    cold = HarborEnv(ENVS / "cake", config=DOCKER)
    try:
        cold.reset()
        expected = _probe(cold)
    finally:
        cold.close()
    assert "/app/menu.txt root:root 644" in expected and "/.harbor_gym root:root 700" in expected
    warm = HarborEnv(ENVS / "cake", config=POOLED)
    try:
        warm.reset()  # the first claim starts (and seeds) its own; the pool fills behind it
        assert cake_pool().fill(timeout=60) == 2
        warm.reset()
        sb = warm._episode.sandbox
        assert sb.warm  # claimed from the ready set: its seeding ran before the reset
        assert _probe(warm) == expected
    finally:
        warm.close()


# SPEC: GYM-2
def test_warm_reset_only_claims():
    env = HarborEnv(ENVS / "cake", config=POOLED)
    try:
        env.reset()
        pool = cake_pool()
        assert pool.prepare is not None  # the episode claims from a prepared pool, not a bare one
        assert pool.fill(timeout=60) == 2
        t0 = time.perf_counter()
        env.reset()
        elapsed = time.perf_counter() - t0
        assert env._episode.sandbox.warm
        assert elapsed < 1.0, elapsed  # no start, no seeding exec on the reset path (a cold reset is ~0.4 s)
    finally:
        env.close()


# SPEC: GYM-2, TURN-7
def test_failing_seed_healthcheck_in_prepare_never_yields_a_sandbox(tmp_path, docker_client):
    task = tmp_path / "cake"
    shutil.copytree(ENVS / "cake", task)
    toml = (task / "task.toml").read_text().replace(
        "[agent]", '[environment.healthcheck]\ncommand = "test -f /tmp/never"\ninterval_sec = 0.1\n'
                   'start_interval_sec = 0.1\nretries = 1\ntimeout_sec = 2\n\n[agent]')
    (task / "task.toml").write_text(toml)
    env = HarborEnv(task, config={**POOLED, "seed_retries": 1})
    try:
        with pytest.raises(SeedError) as err:
            env.reset()
        assert err.value.retryable and err.value.rule == "GYM-2"
        pool = cake_pool()
        with pytest.raises(SandboxError):  # the background preparations fail too
            pool.fill(timeout=60)
        assert pool.stats.failed_starts >= 1
        assert pool.ready_count == 0  # a failed preparation is never ready ...
        assert pool.stats.warm_claims == 0 and pool.stats.cold_claims == 0  # ... nor handed out
        with pytest.raises(SeedError):
            env.reset()
        assert pool.stats.warm_claims == 0 and pool.stats.cold_claims == 0
        assert env._episode is None
    finally:
        env.close()
    close_pools()
    assert wait_until(lambda: labelled(docker_client) == [], 15), labelled(docker_client)


# SPEC: GYM-2
def test_pooled_sandboxes_are_never_handed_out_twice():
    env = HarborEnv(ENVS / "cake", config=POOLED)
    seen = []
    try:
        for _ in range(4):
            env.reset()
            sb = env._episode.sandbox
            seen.append((sb.name, sb.inner.container_id))
            cake_pool().fill(timeout=60)
        pool = cake_pool()
        assert len(set(seen)) == 4, seen
        assert pool.stats.warm_claims + pool.stats.cold_claims == 4
        assert pool.stats.warm_claims >= 3
    finally:
        env.close()


# SPEC: GYM-2, RWD-7
def test_pool_size_alone_switches_pools_on_and_scores_the_same(docker_client):
    scripts = solution_scripts("cake")
    rewards = {}
    for size in (0, 2):
        env = harbor_gym.make(str(ENVS / "cake"), config={**DOCKER, "pool_size": size})
        try:
            env.reset()
            assert (isinstance(env.unwrapped._episode._factory, PoolFactory)) == (size > 0)
            used = {env.unwrapped._episode.sandbox.name}
            got = []
            for script in scripts:
                _, reward, term, trunc, info = env.step(script)
                got.append(reward)
            assert term and not trunc
            rewards[size] = (got, info["episode_result"].reward, dict(info["episode_result"].verifier_rewards))
        finally:
            env.close()
        if size:
            # close() removed its episode's sandbox; the pool's warm ones stay until close_pools()
            names = set(labelled(docker_client))
            assert not (used & names), (used, names)
            assert cake_pool().ready_count + cake_pool().starting_count >= 1
            assert names
            close_pools()
            assert wait_until(lambda: labelled(docker_client) == [], 15), labelled(docker_client)
    assert rewards[2] == rewards[0]
    assert rewards[0][1] == 1.0


# SPEC: GYM-2
def test_plain_episode_with_pool_size_claims_a_seeded_sandbox():
    with Episode(ENVS / "cake", config={**DOCKER, "pool_size": 1}) as ep:
        assert isinstance(ep._factory, PoolFactory) and ep._factory.pool_size == 1
        ep.start()
        out = ep.sandbox.exec("cat /app/menu.txt", timeout=10).stdout
        assert out == (ENVS / "cake" / "environment" / "menu.txt").read_text()
    with Episode(ENVS / "cake", config=DOCKER) as ep:
        assert not isinstance(ep._factory, PoolFactory)  # pool_size=0 (default): no pool
