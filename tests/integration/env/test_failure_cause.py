"""A sandbox outage in ``step`` is ``truncated=True`` with the cause in ``info["cause"]`` (STOP-8, GYM-6/7)."""

from __future__ import annotations

import pytest

from harbor_gym import HarborEnv
from harbor_gym.agents import AgentOutcome

from env_helpers import DOCKER, ENVS, labelled_containers

pytestmark = pytest.mark.docker


def test_stop_8_outage_cause_in_info(docker_client, no_leaks):
    # SPEC: STOP-8, GYM-7 — the container is killed through the SDK while the agent runs.
    seen: dict[str, str] = {}

    class Killer:
        def run(self, turn):
            (running,) = [c for c in labelled_containers(docker_client) if c.status == "running"]
            seen["name"], seen["step"] = running.name, turn.step_name
            running.kill()
            turn.exec("true")
            return AgentOutcome()

    env = HarborEnv(ENVS / "cake", config=DOCKER)
    try:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(Killer())
        assert truncated and not terminated and reward == 0.0
        assert info["turn"].failure_kind == "harbor_gym:sandbox_outage"
        assert info["cause"] == info["turn"].failure_message == info["episode_result"].failure_message
        assert info["cause"].startswith(f"cake: step {seen['step']}: sandbox {seen['name']} died: ")
    finally:
        env.close()


def test_no_cause_key_on_a_clean_step(no_leaks):
    # SPEC: GYM-6 — ``info["cause"]`` only on a truncated turn.
    env = HarborEnv(ENVS / "cake", config=DOCKER)
    try:
        env.reset(seed=0)
        *_, truncated, info = env.step(":")
        assert not truncated and "cause" not in info
    finally:
        env.close()
