"""Each shipped example driven through ``gymnasium.make`` to the end, with the oracle and with scripts (SPEC §1)."""

from __future__ import annotations

import gymnasium
import pytest

import harbor_gym  # noqa: F401  (registers the ids)
from harbor_gym.agents import Oracle
from harbor_gym.wrappers import RewardRollup

from env_helpers import DOCKER, labelled_containers, solution_script, solution_scripts

pytestmark = pytest.mark.docker

ORACLE_TURNS = {
    "cake": ["01-select-cake-base", "02-select-frosting"],
    "gated-counter": ["01-create", "02-increment", "03-double"],
    "kv-sidecar": ["01-store", "02-combine"],
    "notes-pipeline": ["01-gather", "02-count-todos", "03-todo-list"],
    "service-check": ["01-read-status", "02-publish-report"],
}


def run_episode(env, actions):
    obs, info = env.reset(seed=0)
    steps = []
    for action in actions:
        before = obs
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((before, reward, terminated, truncated, info, obs))
        if terminated or truncated:
            break
    return steps


@pytest.mark.parametrize("backend", ["docker", pytest.param("podman", marks=pytest.mark.podman)])
@pytest.mark.parametrize("example", sorted(ORACLE_TURNS))
def test_gym_6_oracle_through_make_scores_every_turn(example, backend, no_leaks, request):
    # SPEC: GYM-3, GYM-6, GYM-7, GYM-8, ORACLE-1; issue 17 item 2: the same on rootful podman
    podman = request.getfixturevalue("podman_rootful") if backend == "podman" else None
    env = gymnasium.make(f"harbor_gym/{example}-v0", config={**DOCKER, "backend": backend})
    try:
        names = ORACLE_TURNS[example]
        steps = run_episode(env, [Oracle()] * len(names))
        assert [s[4]["turn"].step_name for s in steps] == names
        for i, (before, reward, terminated, truncated, info, after) in enumerate(steps):
            assert before["step_name"] == names[i] and before["turn_index"] == i
            assert before["num_turns"] == len(names) and before["instruction"].strip()
            assert type(reward) is float and reward == 1.0
            assert type(terminated) is bool and type(truncated) is bool
            assert terminated == (i == len(names) - 1) and not truncated
            assert info["turn"].reward == 1.0 and info["turn"].failure_kind is None
            assert "episode" not in info  # left to RecordEpisodeStatistics (GYM-6)
        final = steps[-1]
        result = final[4]["episode_result"]
        assert result.reward == 1.0 and result.graded and not result.masked
        assert result.stopped_after_turn is None
        assert final[5]["instruction"] == "" and final[5]["step_name"] == names[-1]  # GYM-3 at the end
        with pytest.raises(RuntimeError):  # GYM-7
            env.step(Oracle())
    finally:
        env.close()
        env.close()  # idempotent (GYM-7)
    if podman is not None:
        assert labelled_containers(podman) == [], "podman containers left behind"


@pytest.mark.parametrize("example", ["cake", "notes-pipeline"])
def test_gym_4_reference_scripts_as_actions(example, no_leaks):
    # SPEC: GYM-4 — a str action is a bash script run in the workdir as the turn's agent user.
    env = gymnasium.make(f"harbor_gym/{example}-v0", config=DOCKER)
    try:
        steps = run_episode(env, solution_scripts(example))
        assert [s[1] for s in steps] == [1.0] * len(ORACLE_TURNS[example])
        assert steps[-1][2] is True
    finally:
        env.close()


GATED = [
    # (example, scripts by turn (None = reference), turn rewards, stopped_after_turn, episode reward, last missed)
    ("gated-counter", [":"], [0.0], "01-create", 0.0, True),
    ("gated-counter", [None, "echo 5 > /app/counter.txt"], [1.0, 0.0], "02-increment", 0.5, True),
    ("gated-counter", [None, None, "echo 3 > /app/counter.txt"], [1.0, 1.0, 0.0], None, 2 / 3, True),
    ("service-check", ["echo version=0 > /app/report.txt"], [0.5], "01-read-status", 0.5, True),
    ("service-check", ["printf version=2.4.1 > /app/report.txt", None], [0.5, 1.0], None, 0.75, False),
]


@pytest.mark.parametrize("example,scripts,rewards,stopped,episode_reward,last_missed", GATED)
def test_stop_1_gates_end_the_episode_early(example, scripts, rewards, stopped, episode_reward, last_missed, no_leaks):
    # SPEC: STOP-1, STOP-2, STOP-3, STOP-4, STOP-9, RWD-7
    names = ORACLE_TURNS[example]
    actions = [s if s is not None else solution_script(example, names[i]) for i, s in enumerate(scripts)]
    env = gymnasium.make(f"harbor_gym/{example}-v0", config=DOCKER)
    try:
        steps = run_episode(env, actions)
        assert [s[1] for s in steps] == pytest.approx(rewards)
        assert steps[-1][2] is True and steps[-1][3] is False
        result = steps[-1][4]["episode_result"]
        assert result.stopped_after_turn == stopped
        assert result.reward == pytest.approx(episode_reward)
        assert steps[-1][4]["turn"].min_reward_missed is last_missed
        assert len(result.turns) == len(rewards)
    finally:
        env.close()


WRONG_FROSTING = "echo ganache > /app/cake/frosting.txt"


@pytest.mark.parametrize(
    "mode,strategy,paid,rollup",
    [
        ("info", None, [1.0, 0.0], 0.5),
        ("sparse", None, [0.0, 0.5], 0.5),
        ("telescoping", None, [1.0, -0.5], 0.5),
        ("sparse", "final", [0.0, 0.0], 0.0),
        ("telescoping", "final", [1.0, -1.0], 0.0),
    ],
)
def test_rwd_7_8_rollup_modes(mode, strategy, paid, rollup, no_leaks):
    # SPEC: RWD-7 (mean), RWD-8 (final) through the RewardRollup wrapper.
    env = RewardRollup(gymnasium.make("harbor_gym/cake-v0", config=DOCKER), strategy=strategy, mode=mode)
    try:
        steps = run_episode(env, [solution_script("cake", "01-select-cake-base"), WRONG_FROSTING])
        assert [s[1] for s in steps] == pytest.approx(paid)
        assert sum(s[1] for s in steps) == pytest.approx(rollup if mode != "info" else 1.0)
        info = steps[-1][4]
        assert info["rollup"]["reward"] == pytest.approx(rollup)
        assert info["rollup"]["strategy"] == (strategy or "mean")
        assert info["rollup"]["graded"] is True and info["rollup"]["masked"] is False
    finally:
        env.close()


def test_rwd_8_final_strategy_of_the_task_and_mean_override(no_leaks):
    # SPEC: RWD-8 — notes-pipeline declares final; a wrong last turn gives 0 while mean gives 2/3.
    scripts = solution_scripts("notes-pipeline")[:2] + [":"]
    env = RewardRollup(gymnasium.make("harbor_gym/notes-pipeline-v0", config=DOCKER), mode="sparse")
    try:
        steps = run_episode(env, scripts)
        assert steps[-1][4]["episode_result"].strategy == "final"
        assert steps[-1][1] == 0.0 and steps[-1][4]["rollup"]["reward"] == 0.0
    finally:
        env.close()
    env = RewardRollup(gymnasium.make("harbor_gym/notes-pipeline-v0", config=DOCKER), strategy="mean", mode="sparse")
    try:
        steps = run_episode(env, scripts)
        assert steps[-1][1] == pytest.approx(2 / 3)
    finally:
        env.close()
