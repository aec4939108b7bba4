"""HarborEnv and HarborDatasetEnv as Gymnasium envs: checker, pristine resets, seeds, asyncio, vector envs."""

from __future__ import annotations

import asyncio
import shutil
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import harbor_gym
from harbor_gym import HarborDatasetEnv, HarborEnv, ResetNeededError
from harbor_gym.agents import Oracle
from harbor_gym.wrappers import ContinueSession, RewardRollup

from env_helpers import DOCKER, ENVS, TEST_LABEL, labelled_containers, solution_script

pytestmark = pytest.mark.docker


def test_gym_1_construction_starts_nothing(docker_client):
    # SPEC: GYM-1 — loading and validating the folder starts no sandbox.
    env = HarborEnv(ENVS / "cake", config=DOCKER)
    assert labelled_containers(docker_client) == []
    with pytest.raises(ResetNeededError):  # GYM-7: no episode yet
        env.step(":")
    env.close()


def test_check_env_on_made_task_env(no_leaks):
    # SPEC: GYM-1..8 — Gymnasium's own checker (nondeterministic spec relaxes determinism checks).
    env = gymnasium.make("harbor_gym/cake-v0", config=DOCKER)
    try:
        assert env.spec.nondeterministic is True
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_check_env_on_made_dataset_env(no_leaks, tmp_path):
    for name in ("cake", "gated-counter"):
        shutil.copytree(ENVS / name, tmp_path / name)
    env = gymnasium.make("harbor_gym/HarborDataset-v0", path=str(tmp_path), config=DOCKER)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


PROBE = (
    "echo container=$(cat /etc/hostname); "
    "ls /tmp/episode-marker 2>/dev/null && echo marker=present || echo marker=absent; "
    "echo logs=$(find /logs -type f 2>/dev/null | wc -l); "
    "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -c '^sleep 4321' || true; "
    "touch /tmp/episode-marker; (sleep $((4320 + 1)) >/dev/null 2>&1 &)"
)


def test_gym_2_resets_are_pristine(no_leaks):
    # SPEC: GYM-2 — each reset starts a new sandbox: no file, process or log of the previous episode remains.
    env = HarborEnv(ENVS / "cake", config=DOCKER)
    try:
        outputs = []
        for _ in range(2):
            env.reset()
            _, _, _, _, info = env.step(PROBE)
            outputs.append(info["turn"].output_tail)
        first, second = outputs
        assert "marker=absent" in first and "marker=absent" in second
        assert "logs=0" in second
        container = [line for line in first.splitlines() if line.startswith("container=")]
        container2 = [line for line in second.splitlines() if line.startswith("container=")]
        assert container and container2 and container != container2
        # the background `sleep 4321` of episode 1 is not in episode 2 (count printed before starting one)
        counts = [line for line in second.splitlines() if line.strip().isdigit()]
        assert counts and counts[0].strip() == "0"
        # Within an episode the same probe does see them (TURN-6, TURN-10): the check above can fail.
        _, _, _, _, info = env.step(PROBE)
        same = info["turn"].output_tail
        assert "marker=present" in same
        assert [line for line in same.splitlines() if line.strip().isdigit()] == ["1"]
    finally:
        env.close()


def test_seeds_reproduce_sampled_actions(no_leaks):
    # The action space is seeded from reset(seed=...): the same seed gives the same no-op samples (GYM-4).
    env = HarborEnv(ENVS / "cake", config=DOCKER)
    try:
        draws = []
        for seed in (5, 5, 6):
            env.reset(seed=seed)
            draws.append([env.action_space.sample() for _ in range(8)])
        assert draws[0] == draws[1]
        assert all(script in harbor_gym.spaces.NOOP_SCRIPTS for script in draws[0] + draws[2])
    finally:
        env.close()


def test_dataset_reset_picks_reproducibly_and_by_option(tmp_path, no_leaks):
    for name in ("cake", "gated-counter", "service-check"):
        shutil.copytree(ENVS / name, tmp_path / name)
    tasks = []
    for _ in range(2):
        env = HarborDatasetEnv(tmp_path, config=DOCKER)
        try:
            seq = [env.reset(seed=11)[0]["task_id"]] + [env.reset()[0]["task_id"] for _ in range(3)]
            tasks.append(seq)
        finally:
            env.close()
    assert tasks[0] == tasks[1]
    env = HarborDatasetEnv(tmp_path, config=DOCKER)
    try:
        obs, info = env.reset(options={"task": "gated-counter"})
        assert obs["task_id"] == "gated-counter" and obs["step_name"] == "01-create" and obs["num_turns"] == 3
        with pytest.raises(harbor_gym.ConfigError, match="nope"):
            env.reset(options={"task": "nope"})
    finally:
        env.close()


def test_env_runs_inside_a_running_event_loop(no_leaks):
    # Jupyter runs an event loop; the sync API must not call asyncio.run.
    async def main():
        env = HarborEnv(ENVS / "cake", config=DOCKER)
        try:
            env.reset()
            rewards = []
            terminated = False
            while not terminated:
                _, reward, terminated, truncated, _ = env.step(Oracle())
                rewards.append(reward)
            return rewards
        finally:
            env.close()

    assert asyncio.run(main()) == [1.0, 1.0]


def cake_scripts():
    return [solution_script("cake", "01-select-cake-base"), solution_script("cake", "02-select-frosting")]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_gymnasium_vector_envs_run_four_copies(kind, docker_client):
    # Gymnasium's own vector envs: 4 copies of cake to completion with script actions; nothing labelled remains.
    fns = [lambda: gymnasium.make("harbor_gym/cake-v0", config=DOCKER) for _ in range(4)]
    if kind == "sync":
        venv = gymnasium.vector.SyncVectorEnv(fns)
    else:
        venv = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False)
    try:
        obs, _ = venv.reset(seed=3)
        assert list(obs["step_name"]) == ["01-select-cake-base"] * 4
        scripts = cake_scripts()
        total = np.zeros(4)
        for turn in range(2):
            obs, reward, terminated, truncated, info = venv.step(tuple([scripts[turn]] * 4))
            total += reward
        assert total.tolist() == [2.0] * 4
        assert terminated.all() and not truncated.any()
    finally:
        venv.close()
    left = docker_client.containers.list(all=True, filters={"label": "=".join(TEST_LABEL)})
    assert left == []


def test_rollup_pays_zero_for_an_ungraded_episode(tmp_path, no_leaks):
    # SPEC: STOP-5 — a step-1 preparation failure is ungraded (reward None); the wrapper pays 0 and says so.
    task = tmp_path / "bad-setup"
    shutil.copytree(ENVS / "cake", task)
    workdir = task / "steps" / "01-select-cake-base" / "workdir"
    workdir.mkdir()
    (workdir / "setup.sh").write_text("#!/bin/bash\nexit 3\n")
    env = RewardRollup(HarborEnv(task, config=DOCKER), mode="sparse")
    try:
        env.reset()
        _, reward, terminated, truncated, info = env.step(Oracle())
        assert terminated and not truncated and reward == 0.0
        assert info["turn"].failure_kind == "harbor:step_setup_failed"
        assert info["rollup"] == {"reward": None, "paid": 0.0, "strategy": "mean", "masked": False, "graded": False}
    finally:
        env.close()


def test_render_ansi_shows_turn_and_result(no_leaks):
    env = HarborEnv(ENVS / "cake", config=DOCKER, render_mode="ansi")
    try:
        env.reset()
        text = env.render()
        assert "01-select-cake-base" in text and "turn 1/2" in text
        env.step(Oracle())
        env.step(Oracle())
        text = env.render()
        assert "episode: reward 1.0" in text
    finally:
        env.close()


class _NoContinueAgent:
    def run(self, turn):  # pragma: no cover - never called: refused at reset
        raise AssertionError("must not run")


def test_ses_3_continue_session_refuses_an_agent_without_support_before_any_sandbox(docker_client):
    # SPEC: LOAD-22, GYM-4 — refused at reset, before any sandbox starts.
    env = ContinueSession(HarborEnv(ENVS / "cake", config=DOCKER))
    try:
        with pytest.raises(harbor_gym.SeedRefusedError, match="LOAD-22"):
            env.reset(options={"agent": _NoContinueAgent()})
        assert labelled_containers(docker_client) == []
    finally:
        env.close()
