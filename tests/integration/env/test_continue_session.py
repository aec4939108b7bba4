"""The `ContinueSession` wrapper end to end on Docker (SPEC SES-1..4, LOAD-22, GYM-3/4): one harness session per
episode through the Gymnasium face, the observation history, and the refusals before any sandbox starts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from harbor_gym import HarborEnv, SeedRefusedError
from harbor_gym.agents import AgentOutcome
from harbor_gym.errors import SessionMismatchError
from harbor_gym.wrappers import ContinueSession

from env_helpers import DOCKER, labelled_containers
from task_folders import WORKDIR_KEEP

pytestmark = pytest.mark.docker

HEAD = """schema_version = "1.4"
[environment]
docker_image = "debian:bookworm-slim"
workdir = "/app"
network_mode = "no-network"
[agent]
timeout_sec = 20
"""


def _task(root: Path, steps: dict[str, str], extra: str = "") -> Path:
    """A task folder: one ``[[steps]]`` per name, each with its own test.sh (shell condition -> reward 1 else 0)."""
    root.mkdir(parents=True, exist_ok=True)
    text = HEAD
    for name, check in steps.items():
        text += f'\n[[steps]]\nname = "{name}"\n{extra if name != "s1" else ""}[steps.verifier]\ntimeout_sec = 10\n'
        step = root / "steps" / name
        (step / "tests").mkdir(parents=True, exist_ok=True)
        (step / "instruction.md").write_text(f"Do step {name}.\n")
        (step / "tests" / "test.sh").write_text(
            f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
        os.chmod(step / "tests" / "test.sh", 0o755)
    (root / "task.toml").write_text(text)
    (root / "instruction.md").write_text("never sent\n")
    (root / "environment").mkdir(exist_ok=True)
    (root / WORKDIR_KEEP).write_text("")  # /app exists under Harbor semantics too (issue 16)
    return root


class Harness:
    """A recording `HarnessSession` agent with ``supports_continue``; ``close`` marks the sandbox."""

    supports_continue = True
    name = "harness"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._turn = None

    def _act(self, kind: str, turn) -> AgentOutcome:
        self.calls.append(f"{kind}:{turn.step_name}")
        self._turn = turn
        turn.exec(f"echo {turn.step_name} >> /app/conv.txt")
        return AgentOutcome(output_tail=f"tail of {turn.step_name}", response=turn.step_name)

    def start(self, turn) -> AgentOutcome:
        return self._act("start", turn)

    def continue_turn(self, turn) -> AgentOutcome:
        return self._act("continue", turn)

    def close(self) -> None:
        self.calls.append("close")
        self._turn.exec("touch /app/closed")


# SPEC: SES-3, SES-4, GYM-3
def test_ses_3_continue_session_history_and_close_before_last_verifier(tmp_path, no_leaks):
    task = _task(tmp_path / "t", {"s1": "[ ! -f /app/closed ]", "s2": "[ ! -f /app/closed ]",
                                  "s3": "[ -f /app/closed ] && [ \"$(wc -l < /app/conv.txt)\" = 3 ]"})
    env = ContinueSession(HarborEnv(task, config=DOCKER))
    agent = Harness()
    try:
        assert env.unwrapped.config.turn_sessions.value == "continue"  # SES-1
        obs, _ = env.reset(options={"agent": agent})
        assert obs["history"] == () and env.observation_space.contains(obs)
        rewards = []
        for turn in range(3):
            obs, reward, terminated, truncated, info = env.step(agent)
            rewards.append(reward)
            assert env.observation_space.contains(obs), obs
            assert len(obs["history"]) == turn + 1  # one entry per earlier turn
            last = obs["history"][-1]
            assert last["instruction"] == f"Do step s{turn + 1}.\n" and last["action"] == "harness"
            assert last["output_tail"] == f"tail of s{turn + 1}" and last["reward"] == np.float64(1.0)
        assert terminated and not truncated and rewards == [1.0, 1.0, 1.0]
        assert info["episode_result"].response == "s3"  # the last activation's (SES-3)
        assert agent.calls == ["start:s1", "continue:s2", "continue:s3", "close"]
        obs, _ = env.reset(options={"agent": agent})  # a new episode: a new session, an empty history
        assert obs["history"] == ()
    finally:
        env.close()
    assert agent.calls[-1] == "close" and agent.calls.count("close") == 1  # no activation in episode 2: no close


# SPEC: SES-3
def test_ses_3_other_agent_object_raises_and_the_turn_does_not_run(tmp_path, no_leaks):
    task = _task(tmp_path / "t", {"s1": "true", "s2": "[ \"$(cat /app/conv.txt)\" = \"$(printf 's1\\ns2')\" ]"})
    agent, other = Harness(), Harness()
    env = ContinueSession(HarborEnv(task, config=DOCKER, agent=agent))  # announced at construction (GYM-4)
    try:
        env.reset()
        obs, *_ = env.step(agent)
        with pytest.raises(ValueError) as err:
            env.step(other)
        assert isinstance(err.value, SessionMismatchError) and err.value.rule == "SES-3"
        assert other.calls == []
        # the episode goes on, history unchanged by the refusal; s2's verifier checks that /app/conv.txt holds
        # exactly s1, s2 (no side effect of the refused turn in the sandbox)
        obs2, reward, terminated, _, _ = env.step(agent)
        assert [h["action"] for h in obs2["history"]] == ["harness", "harness"] and reward == 1.0 and terminated
    finally:
        env.close()


# SPEC: LOAD-22, GYM-4, DIFF-11
def test_load_22_refused_at_reset_before_any_sandbox(tmp_path, docker_client, no_leaks):
    class NoContinue(Harness):
        supports_continue = False

    plain = _task(tmp_path / "a", {"s1": "true", "s2": "true"})
    users = _task(tmp_path / "b", {"s1": "true", "s2": "true"}, extra='[steps.agent]\nuser = "nobody"\n')
    for task, agent, rule in ((plain, NoContinue(), "LOAD-22"), (users, Harness(), "LOAD-22"), (plain, None, "GYM-4")):
        env = ContinueSession(HarborEnv(task, config=DOCKER))
        try:
            with pytest.raises(SeedRefusedError) as err:
                env.reset(options={"agent": agent} if agent is not None else None)
            assert err.value.rule == rule and labelled_containers(docker_client) == []
        finally:
            env.close()
    # DIFF-11: under semantics="harbor" the user switch is allowed with a continued session
    agent = Harness()
    env = ContinueSession(HarborEnv(users, config={**DOCKER, "semantics": "harbor"}))
    try:
        env.reset(options={"agent": agent})
        env.step(agent)
        *_, terminated, _, info = env.step(agent)
        assert terminated and info["episode_result"].graded
        assert agent.calls == ["start:s1", "continue:s2", "close"]
    finally:
        env.close()


# SPEC: SES-3, STOP-1
def test_ses_3_early_stop_closes_the_session(tmp_path, no_leaks):
    task = _task(tmp_path / "t", {"s1": "false", "s2": "true"})
    text = (task / "task.toml").read_text().replace('name = "s1"\n', 'name = "s1"\nmin_reward = 1.0\n')
    (task / "task.toml").write_text(text)
    agent = Harness()
    env = ContinueSession(HarborEnv(task, config=DOCKER))
    try:
        env.reset(options={"agent": agent})
        obs, reward, terminated, _, info = env.step(agent)
        assert terminated and info["episode_result"].stopped_after_turn == "s1" and reward == 0.0
        assert agent.calls == ["start:s1", "close"] and len(obs["history"]) == 1
        assert env.observation_space.contains(obs)
    finally:
        env.close()
    assert agent.calls.count("close") == 1
