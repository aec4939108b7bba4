"""areset/astep on a real engine (issue 15): 16 episodes with an async agent on one event loop while a ticker
keeps its period, and a cancelled astep that leaves nothing behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from harbor_gym import HarborEnv
from harbor_gym.env import CANCELLED_KIND

from async_helpers import DOCKER, AsyncWriter, labelled

pytestmark = pytest.mark.docker


async def _ticker(lags: list[float], stop: asyncio.Event, period: float = 0.05) -> None:
    """Sleeps ``period`` again and again, recording how late each wake-up was."""
    while not stop.is_set():
        t0 = time.monotonic()
        await asyncio.sleep(period)
        lags.append(time.monotonic() - t0 - period)


async def _episode(task, agent) -> tuple[float, list[float]]:
    env = HarborEnv(task, config=DOCKER)
    try:
        obs, info = await env.areset(seed=1)
        rewards = []
        while True:
            obs, reward, term, trunc, info = await env.astep(agent)
            rewards.append(reward)
            if term or trunc:
                return info["episode_result"].reward, rewards
    finally:
        await env.aclose()


def test_16_async_episodes_on_one_loop_keep_the_ticker_on_time(task, no_leaks):
    # SPEC: GYM-4/GYM-6 (issue 15) — areset/astep with an async agent (await turn.aexec): 16 concurrent episodes
    # on one loop all score 1.0 and a ticker task's lag stays under 500 ms (sandbox calls never block the loop).
    async def main():
        lags: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop))
        agents = [AsyncWriter(delay=0.2) for _ in range(16)]
        t0 = time.monotonic()
        results = await asyncio.gather(*(_episode(task, a) for a in agents))
        wall = time.monotonic() - t0
        stop.set()
        await ticker
        return results, lags, agents, wall

    results, lags, agents, wall = asyncio.run(main())
    assert [r for r, _ in results] == [1.0] * 16
    assert all(rewards == [1.0, 1.0] for _, rewards in results)
    assert all(a.turns == 2 for a in agents)
    assert len(lags) > 10 and max(lags) < 0.5, f"ticker lag max {max(lags):.3f}s"


def test_async_agent_through_sync_step(task, no_leaks):
    # issue 15: the sync protocol is unchanged and an async agent also works through plain reset/step.
    env = HarborEnv(task, config=DOCKER)
    try:
        env.reset(seed=0)
        agent = AsyncWriter()
        _, r1, *_ = env.step(agent)
        _, r2, term, trunc, info = env.step(agent)
        assert (r1, r2, term, trunc) == (1.0, 1.0, True, False)
        assert info["episode_result"].reward == 1.0
    finally:
        env.close()


def test_cancelled_astep_stops_the_turn_and_leaves_nothing(task, docker_client, no_leaks):
    # issue 15: cancelling astep stops that turn's sandbox work (a 60 s command ends within seconds), leaks no
    # container, is not agent-caused, and the episode ends truncated with the named cause.
    class Sleeper:
        async def run(self, turn):
            res = await turn.aexec("sleep 60; echo ok > /app/a.txt")
            from harbor_gym.agents import AgentOutcome
            return AgentOutcome(exit_code=res.exit_code)

    async def main():
        env = HarborEnv(task, config=DOCKER)
        await env.areset(seed=0)
        assert len(labelled(docker_client)) == 1
        step = asyncio.create_task(env.astep(Sleeper()))
        await asyncio.sleep(2.0)
        t0 = time.monotonic()
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        took = time.monotonic() - t0
        left = labelled(docker_client)
        result = env.last_result
        # the env goes on: a new episode after the cancelled one
        await env.areset(seed=1)
        obs, reward, *_ = await env.astep(AsyncWriter())
        await env.aclose()
        return took, left, result, reward

    took, left, result, reward = asyncio.run(main())
    assert took < 20, f"cancellation took {took:.1f}s"
    assert left == []  # removed before astep re-raised
    assert result.failure_kind == CANCELLED_KIND and not result.graded and result.reward is None
    assert result.agent_caused is False and result.outage_cause is None
    assert result.turns and result.turns[-1].failure_kind == CANCELLED_KIND
    assert not result.turns[-1].agent_caused
    assert reward == 1.0


def test_cancelled_areset_leaves_nothing(task, docker_client, no_leaks):
    # issue 15: a reset cancelled while seeding stops what it started.
    async def main():
        env = HarborEnv(task, config=DOCKER)
        reset = asyncio.create_task(env.areset(seed=0))
        await asyncio.sleep(0.05)  # the seed is under way (a container start takes longer)
        reset.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reset
        left = labelled(docker_client)
        await env.aclose()
        return left

    assert asyncio.run(main()) == []
