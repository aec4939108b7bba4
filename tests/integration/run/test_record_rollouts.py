"""`RecordRollouts` writes the rows ``harbor-gym run`` writes, from any Gymnasium loop (Docker)."""

from __future__ import annotations

import shutil

import pytest

import harbor_gym
from harbor_gym.agents import Oracle
from harbor_gym.run import FailureRow, RolloutRow
from harbor_gym.wrappers import RecordRollouts

from run_helpers import ENVS, LABEL, read_rows, run_cli

pytestmark = pytest.mark.docker

DOCKER = {"backend": "docker", "labels": dict([LABEL])}
_VOLATILE = {"duration_sec", "log_dir", "turns"}
_VOLATILE_TURN = {"durations_sec", "log_dir"}


def _loop(env, actions, seed):
    obs, info = env.reset(seed=seed)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break


def _stable(row: dict) -> dict:
    data = {k: v for k, v in row.items() if k not in _VOLATILE}
    data["turns"] = [{k: v for k, v in t.items() if k not in _VOLATILE_TURN} for t in row["turns"]]
    return data


def test_record_rollouts_rows_equal_the_cli_rows(tmp_path, no_leaks):
    # SPEC: GYM-6, GYM-8 — the same info records give the same rows, in a plain Gymnasium loop and in the CLI.
    from harbor_gym.run import episode_seed

    out = tmp_path / "loop"
    env = RecordRollouts(harbor_gym.make(str(ENVS / "cake"), config=DOCKER), out, agent="oracle")
    try:
        _loop(env, [Oracle(), Oracle()], seed=episode_seed(0, "cake", 0))
        _loop(env, ["mkdir -p /app/cake; echo chocolate > /app/cake/base.txt", "echo ganache > /app/cake/frosting.txt"],
              seed=5)
    finally:
        env.close()
    rows = [RolloutRow.model_validate(r) for r in read_rows(out / "rollouts.jsonl")]
    assert [(r.rollout, r.reward, r.seed) for r in rows] == [(0, 1.0, episode_seed(0, "cake", 0)), (1, 0.5, 5)]
    assert [t.reward for t in rows[1].turns] == [1.0, 0.0]

    cli_out = tmp_path / "cli"
    proc = run_cli(str(ENVS / "cake"), "--backend", "docker", "--out", str(cli_out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cli_row,) = read_rows(cli_out / "rollouts.jsonl")
    assert _stable(read_rows(out / "rollouts.jsonl")[0]) == _stable(cli_row)


def test_record_rollouts_step_one_preparation_failure_is_a_failure_row(tmp_path, no_leaks):
    # SPEC: STOP-5 — a rollout recorder writes a step-1 preparation failure to the failures file, not the rollouts.
    task = tmp_path / "cake"
    shutil.copytree(ENVS / "cake", task)
    (task / "steps" / "01-select-cake-base" / "workdir").mkdir()
    (task / "steps" / "01-select-cake-base" / "workdir" / "setup.sh").write_text("exit 1\n")
    out = tmp_path / "out"
    env = RecordRollouts(harbor_gym.make(str(task), config=DOCKER), out)
    try:
        _loop(env, [Oracle(), Oracle()], seed=1)
    finally:
        env.close()
    assert read_rows(out / "rollouts.jsonl") == []
    (raw,) = read_rows(out / "rollouts_failures.jsonl")
    row = FailureRow.model_validate(raw)
    assert row.failure_kind == "harbor:step_setup_failed" and row.rollout == 0 and row.seed == 1
    assert [t.step_name for t in row.turns] == ["01-select-cake-base"]
