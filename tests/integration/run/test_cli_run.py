"""``harbor-gym run`` as a subprocess on Docker: rollout files against the schema and envs/README.md's expected
rewards, per-turn folders, exit codes, retries, failures, and nothing labelled left behind."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from harbor_gym.run import FailureRow, RolloutRow, episode_seed

from run_helpers import ENVS, read_rows, run_cli

pytestmark = pytest.mark.docker

#: envs/README.md "The oracle, turn by turn": turn rewards and episode verifier_rewards.
ORACLE = {
    "cake": ([1.0, 1.0], {"reward": 1.0}),
    "gated-counter": ([1.0, 1.0, 1.0], {"reward": 1.0}),
    "notes-pipeline": ([1.0, 1.0, 1.0], {"reward": 1.0}),
    "service-check": ([1.0, 1.0], {"reward": 1.0, "correct": 0.5, "style": 0.5, "served": 0.5}),
}


def test_run_oracle_over_envs_writes_graded_rows_with_expected_rewards(tmp_path, no_leaks):
    # SPEC: ORACLE-4, GYM-8 — every shipped example, concurrency 2, scores what envs/README.md says.
    out = tmp_path / "out"
    proc = run_cli("envs/", "--agent", "oracle", "--concurrency", "2", "--backend", "docker", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_rows(out / "rollouts.jsonl")
    examples = sorted(p.name for p in ENVS.iterdir() if (p / "task.toml").is_file())
    assert sorted(r["task_id"] for r in rows) == examples
    assert read_rows(out / "rollouts_failures.jsonl") == []
    for raw in rows:
        row = RolloutRow.model_validate(raw)  # the schema
        assert row.agent == "oracle" and row.rollout == 0 and row.attempt == 1
        assert row.backend == "docker"  # issue 16 item 5: the backend used is recorded in every row
        assert row.seed == episode_seed(0, row.task_id, 0)
        assert row.reward == 1.0 and row.stopped_after_turn is None
        if row.task_id in ORACLE:
            turns, verifier = ORACLE[row.task_id]
            assert [t.reward for t in row.turns] == turns
            assert row.verifier_rewards == pytest.approx(verifier)
        for turn in row.turns:
            assert turn.agent_status == "completed" and turn.agent_exit_code == 0
            assert turn.durations_sec["turn"] > 0
            folder = Path(turn.log_dir)
            assert folder.is_relative_to(out / "logs" / row.task_id / "rollout-0")
            assert (folder / "verifier" / "test-stdout.txt").is_file()
            assert (folder / "agent" / "oracle.txt").is_file()
            assert (folder / "verifier" / "artifacts" / "manifest.json").is_file()
    # the summary names every task and where the results are
    for name in examples:
        assert name in proc.stdout
    assert str(out / "rollouts.jsonl") in proc.stdout


def _script_dir(tmp_path: Path) -> Path:
    """Per-step scripts (envs/README.md "Wrong scripts"): cake's frosting wrong, gated-counter's first step a no-op."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "01-select-cake-base.sh").write_text("mkdir -p /app/cake && echo chocolate > /app/cake/base.txt\n")
    (scripts / "02-select-frosting.sh").write_text("echo ganache > /app/cake/frosting.txt\n")
    (scripts / "01-create.sh").write_text(":\n")
    return scripts


def test_run_script_folder_k2_c2_rewards_and_early_stops(tmp_path, dataset, no_leaks):
    # SPEC: GYM-4, RWD-7, STOP-1, STOP-9 — K=2, C=2 over cake + gated-counter with wrong scripts.
    out = tmp_path / "out"
    proc = run_cli(str(dataset), "--agent", f"script:{_script_dir(tmp_path)}", "-k", "2", "-c", "2",
                   "--backend", "docker", "--out", str(out), "--seed", "7")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every episode graded, whatever its reward
    rows = [RolloutRow.model_validate(r) for r in read_rows(out / "rollouts.jsonl")]
    assert sorted((r.task_id, r.rollout) for r in rows) == [("cake", 0), ("cake", 1), ("gated-counter", 0),
                                                           ("gated-counter", 1)]
    for row in rows:
        assert row.seed == episode_seed(7, row.task_id, row.rollout)
        if row.task_id == "cake":
            assert [t.reward for t in row.turns] == [1.0, 0.0] and row.reward == 0.5
            assert row.stopped_after_turn is None
        else:
            assert [t.reward for t in row.turns] == [0.0] and row.reward == 0.0
            assert row.stopped_after_turn == "01-create" and row.turns[0].min_reward_missed
    assert "gated-counter" in proc.stdout and "0.500" in proc.stdout


def test_run_step_one_preparation_failure_goes_to_failures_file(tmp_path, no_leaks):
    # SPEC: STOP-5 — a step-1 preparation failure is ungraded: failures file, exit 1.
    task = tmp_path / "cake"
    shutil.copytree(ENVS / "cake", task)
    workdir = task / "steps" / "01-select-cake-base" / "workdir"
    workdir.mkdir()
    (workdir / "setup.sh").write_text("exit 3\n")
    out = tmp_path / "out"
    proc = run_cli(str(task), "--backend", "docker", "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert read_rows(out / "rollouts.jsonl") == []
    (raw,) = read_rows(out / "rollouts_failures.jsonl")
    row = FailureRow.model_validate(raw)
    assert row.failure_kind == "harbor:step_setup_failed" and not row.retryable and row.attempt == 1
    assert "harbor:step_setup_failed" in row.reason and "01-select-cake-base" in row.reason
    assert "harbor:step_setup_failed" in proc.stdout


def test_run_retryable_failure_is_retried_then_written_with_its_reason(tmp_path, no_leaks):
    # SPEC: STOP-6 — an agent error with policy retry ends the episode ungraded and retryable; --retries 1 runs it
    # twice and writes one failure row (attempt 2).
    agent_file = tmp_path / "flaky.py"
    agent_file.write_text(textwrap.dedent("""
        from harbor_gym.agents import AgentOutcome

        class Flaky:
            name = "flaky"

            def run(self, turn):
                return AgentOutcome(status="error", policy="retry", output_tail="flaky")
    """))
    out = tmp_path / "out"
    proc = run_cli("envs/cake", "--agent", f"{agent_file}:Flaky", "--retries", "1", "--backend", "docker",
                   "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (raw,) = read_rows(out / "rollouts_failures.jsonl")
    row = FailureRow.model_validate(raw)
    assert row.failure_kind == "harbor_gym:agent_retry" and row.retryable and row.attempt == 2
    assert row.agent == f"{agent_file}:Flaky"
    # both attempts kept their logs under the rollout's folder
    assert len(list((out / "logs" / "cake" / "rollout-0" / "cake").iterdir())) == 2


def test_run_module_class_agent(tmp_path, no_leaks):
    # SPEC: GYM-4 — module:Class imports the class from the current folder's import path and runs it every turn.
    pkg = tmp_path / "myagents.py"
    pkg.write_text(textwrap.dedent("""
        from harbor_gym.agents import Oracle

        class Solver(Oracle):
            name = "solver"
    """))
    out = tmp_path / "out"
    import subprocess
    from run_helpers import cli_args

    proc = subprocess.run(cli_args(str(ENVS / "cake"), "--agent", "myagents:Solver", "--backend", "docker",
                                   "--out", str(out)), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = read_rows(out / "rollouts.jsonl")
    assert row["agent"] == "myagents:Solver" and row["reward"] == 1.0


def test_run_dataset_with_a_broken_task_reports_it_and_runs_the_others(tmp_path, dataset, no_leaks):
    # SPEC: LOAD-1, DS-4 — the broken task is named, the others run, exit 1.
    (dataset / "broken").mkdir()
    (dataset / "broken" / "task.toml").write_text("this is = not toml [")
    out = tmp_path / "out"
    proc = run_cli(str(dataset), "--backend", "docker", "--out", str(out), "-c", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "broken" in proc.stderr and "LOAD-1" in proc.stderr
    assert sorted(r["task_id"] for r in read_rows(out / "rollouts.jsonl")) == ["cake", "gated-counter"]
    (raw,) = read_rows(out / "rollouts_failures.jsonl")
    row = FailureRow.model_validate(raw)
    assert row.task_id == "broken" and row.rollout is None and row.failure_kind == "harbor_gym:task_load_failed"
    assert "LOAD-1" in row.reason
    # a rerun does not repeat the finished episodes nor duplicate the load failure
    again = run_cli(str(dataset), "--backend", "docker", "--out", str(out))
    assert again.returncode == 1
    assert len(read_rows(out / "rollouts.jsonl")) == 2 and len(read_rows(out / "rollouts_failures.jsonl")) == 1
