"""Vector envs that never lie (issue 15), on a real engine: both on_error modes on a broken task, a slot failing N
times in a row raises, per-slot agents from agent_factory with continued sessions, and make_vec's async mode."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import harbor_gym  # noqa: F401 - registers the ids
from harbor_gym import HarborEnv
from harbor_gym.agents import AgentOutcome
from harbor_gym.errors import SubEnvError
from harbor_gym.vector import HarborVectorEnv

from vector_helpers import DOCKER, ENVS, REPO, solutions

sys.path.insert(0, str(REPO / "tests"))
from task_folders import REWARD_0, grade, toml, write_task  # noqa: E402

pytestmark = pytest.mark.docker

CAKE = solutions("cake")
ABSENT = {**DOCKER, "pull_policy": "never"}


def _broken(root: Path) -> Path:
    """A task whose image cannot be had: every reset fails with a non-retryable SeedError."""
    text = toml(["a"]).replace('docker_image = "debian:bookworm-slim"', 'docker_image = "harbor-gym-test/absent:1"')
    return write_task(root, {"task.toml": text, "steps/a/tests/test.sh": REWARD_0}, "broken")


def _envs(tmp_path: Path):
    broken = _broken(tmp_path)
    return [lambda: HarborEnv(ENVS / "cake", config=ABSENT), lambda: HarborEnv(broken, config=ABSENT)]


def test_on_error_raise_names_slot_task_and_cause(tmp_path, no_leaks):
    # issue 15: a non-retryable reset failure raises SubEnvError naming the slot, the task and the cause.
    venv = HarborVectorEnv(env_fns=_envs(tmp_path))
    try:
        with pytest.raises(SubEnvError) as err:
            venv.reset(seed=0)
        assert err.value.slot == 1 and err.value.task_id == "broken"
        assert "sub-env 1 (task broken)" in str(err.value) and "harbor-gym-test/absent:1" in str(err.value)
    finally:
        venv.close()


def test_on_error_mask_gives_nan_and_not_trainable_then_raises_after_n(tmp_path, no_leaks):
    # issue 15: on_error="mask": the broken slot's reward is NaN and trainable False, the good slot's reward is
    # real and trainable; a slot failing max_consecutive_failures calls in a row raises.
    venv = HarborVectorEnv(env_fns=_envs(tmp_path), on_error="mask", max_consecutive_failures=3)
    try:
        obs, info = venv.reset(seed=0)  # failure 1 of slot 1
        assert info["_error"].tolist() == [False, True]
        obs, reward, term, trunc, info = venv.step([CAKE[obs["step_name"][0]], ":"])  # same-step reset: 2
        assert reward[0] == 1.0 and math.isnan(reward[1])
        assert info["trainable"].tolist() == [True, False]
        assert trunc.tolist() == [False, True]
        with pytest.raises(SubEnvError, match="3 calls in a row"):  # failure 3
            venv.step([CAKE[obs["step_name"][0]], ":"])
    finally:
        venv.close()


class Harness:
    """A continued-session agent (SES-3): one per episode; counts its activations."""

    supports_continue = True
    name = "harness"

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.calls: list[str] = []

    def _act(self, kind: str, turn) -> AgentOutcome:
        self.calls.append(f"{kind}:{turn.step_name}")
        turn.exec(f"echo ok > /app/{turn.step_name}.txt")
        return AgentOutcome()

    def start(self, turn):
        return self._act("start", turn)

    def continue_turn(self, turn):
        return self._act("continue", turn)

    def close(self) -> None:
        self.calls.append("close")


def test_agent_factory_gives_each_slot_its_agent_for_continued_sessions(tmp_path, no_leaks):
    # issue 15, SES-3: agent_factory announces a fresh agent per slot and episode; action None is that agent, so
    # a continued session runs start then continue_turn on one object.
    files = {"task.toml": toml(["a", "b"])}
    for step in ("a", "b"):
        files[f"steps/{step}/tests/test.sh"] = grade(f"grep -qx ok /app/{step}.txt")
    task = write_task(tmp_path, files, "two")
    made: list[Harness] = []

    def factory(slot: int) -> Harness:
        made.append(Harness(slot))
        return made[-1]

    venv = HarborVectorEnv(2, path=task, config={**DOCKER, "turn_sessions": "continue"}, agent_factory=factory,
                           pool_size=0)
    try:
        venv.reset(seed=0)
        first = list(venv.agents)
        assert [a.slot for a in first] == [0, 1] and first[0] is not first[1]
        _, r1, *_ = venv.step([None, None])
        _, r2, term, trunc, info = venv.step([None, None])
        assert r1.tolist() == [1.0, 1.0] and r2.tolist() == [1.0, 1.0] and term.all() and not trunc.any()
        assert all(a.calls == ["start:a", "continue:b", "close"] for a in first)
        assert info["trainable"].all()
        assert venv.agents[0] is not first[0]  # same-step autoreset: a fresh agent for the next episode
    finally:
        venv.close()


def test_async_vector_env_without_shared_memory_and_the_readme_says_so(no_leaks):
    # issue 15: make_vec(..., vectorization_mode="async", vector_kwargs={"shared_memory": False}) works, and the
    # README says so in one line.
    readme = (REPO / "README.md").read_text()
    assert any("vectorization_mode=\"async\"" in line and "shared_memory" in line and "False" in line
               for line in readme.splitlines())
    venv = gymnasium.make_vec("harbor_gym/cake-v0", num_envs=2, vectorization_mode="async",
                              vector_kwargs={"shared_memory": False}, config=DOCKER)
    try:
        obs, _ = venv.reset(seed=0)
        assert tuple(obs["step_name"]) == ("01-select-cake-base",) * 2
        obs, reward, term, trunc, _ = venv.step([CAKE[s] for s in obs["step_name"]])
        assert np.asarray(reward).tolist() == [1.0, 1.0]
    finally:
        venv.close()
