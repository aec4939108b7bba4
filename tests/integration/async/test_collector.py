"""harbor_gym.rollouts / collect on a real engine (issue 15): every (task, rollout) yielded exactly once, a failing
task included and never raised; back-pressure; Ray gives what threads give for the same seeds."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import harbor_gym
from harbor_gym.run.rows import episode_seed

from async_helpers import DOCKER, AsyncWriter, broken_task, two_step_task

pytestmark = pytest.mark.docker

CONFIG = {**DOCKER, "pull_policy": "never"}


def test_rollouts_yield_every_episode_once_including_a_failing_one(tmp_path, warm_engine, no_leaks):
    # issue 15: K=2 rollouts of 2 good tasks and 1 broken one, C=3: 6 results, one per (task, rollout), the broken
    # task's yielded as seed failures (not raised), each episode with its own agent from the factory.
    two_step_task(tmp_path, "t1")
    two_step_task(tmp_path, "t2")
    broken_task(tmp_path, "zz-broken")
    made: list[tuple[str, int, int]] = []

    def factory(task_id, rollout, seed):
        made.append((task_id, rollout, seed))
        return AsyncWriter()

    async def main():
        out = []
        async for result in harbor_gym.rollouts(tmp_path, agent=factory, rollouts_per_task=2, concurrency=3,
                                                config=CONFIG, retries=1):
            out.append(result)
        return out

    results = asyncio.run(main())
    keys = sorted((r.task_id, r.rollout) for r in results)
    assert keys == [(t, k) for t in ("t1", "t2", "zz-broken") for k in (0, 1)]
    for r in results:
        assert r.seed == episode_seed(0, r.task_id, r.rollout)
        if r.task_id == "zz-broken":
            assert not r.graded and r.reward is None and r.episode is None
            assert r.failure_kind in ("harbor_gym:seed_failed", "harbor_gym:seed_refused") and r.reason
        else:
            assert r.graded and r.reward == 1.0 and r.attempt == 1 and not r.agent_caused
            assert [t.step_name for t in r.episode.turns] == ["a", "b"]
    assert sorted(made) == sorted({(r.task_id, r.rollout, r.seed) for r in results})  # one agent per episode


def test_back_pressure_and_early_close(tmp_path, warm_engine, docker_client, no_leaks):
    # issue 15: while the consumer holds a result no new episode starts (C in flight at most), and breaking out
    # of the iterator cancels the episodes in flight: nothing labelled remains.
    two_step_task(tmp_path, "t1")
    started: list[float] = []

    class Listener:
        def episode_started(self, task_id, rollout):
            started.append(time.monotonic())

    async def main():
        seen = 0
        async for result in harbor_gym.rollouts(tmp_path, agent=lambda t, k, s: AsyncWriter(), rollouts_per_task=6,
                                                concurrency=2, config=CONFIG, listener=Listener()):
            seen += 1
            before = len(started)
            await asyncio.sleep(3.0)  # a slow consumer: nothing new may start meanwhile
            assert len(started) == before
            if seen == 2:
                break
        return seen

    assert asyncio.run(main()) == 2
    assert len(started) <= 4  # 2 at first, one more after each of the 2 results consumed


def test_collect_under_ray_matches_threads(tmp_path, warm_engine, no_leaks):
    # issue 15: executor="ray" gives the same results as threads for the same seeds (a local Ray cluster).
    ray = pytest.importorskip("ray")

    def seeded(task_id: str, rollout: int, seed: int) -> str:
        """A str agent solving both steps iff the episode seed is even (a nested function: Ray pickles it by
        value, so its workers need not import this test module)."""
        return "echo ok > /app/a.txt; echo ok > /app/b.txt" if seed % 2 == 0 else ":"

    two_step_task(tmp_path, "t1")
    two_step_task(tmp_path, "t2")
    runs = {}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 * 1024,
             resources={"harbor_engine": 8})  # issue 17: this node has an engine (every actor/task asks for 1)
    try:
        for executor in ("threads", "ray"):
            results = harbor_gym.collect(tmp_path, seeded, rollouts_per_task=3, concurrency=3, config=CONFIG,
                                         executor=executor, seed=5)
            runs[executor] = sorted((r.task_id, r.rollout, r.seed, r.reward, r.graded, r.attempt) for r in results)
    finally:
        ray.shutdown()
    assert runs["ray"] == runs["threads"]
    assert len(runs["threads"]) == 6
    assert all(r[3] == (1.0 if r[2] % 2 == 0 else 0.0) for r in runs["threads"])  # the factory got the seeds
