"""ORACLE rules on real sandboxes and the validate API/CLI: solutions per step, unvalidatable steps, reports."""

import shutil
import subprocess
import sys

import pytest

from harbor_gym.agents import Oracle
from harbor_gym.episode import validate

from .conftest import BACKENDS, REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker


# SPEC: ORACLE-1, ORACLE-2
@pytest.mark.parametrize("backend", BACKENDS)
def test_oracle_1_solution_replaced_per_step_step_folder_wins(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", 'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n'],
                          tail='[solution.env]\nSOL = "from-solution-env"\n'),
        "solution/solve.sh": "#!/bin/bash\necho \"top $(id -un) $SOL $DEBIAN_FRONTEND\" > /tmp/s2.txt\n"
                             "ls /solution > /tmp/s2-ls.txt\necho out-of-s2\n",
        "steps/s1/solution/solve.sh": "#!/bin/bash\necho step > /tmp/s1.txt\n",
        "steps/s1/solution/extra.txt": "only in s1\n",
        "steps/s1/tests/test.sh": grade("[ \"$(cat /tmp/s1.txt)\" = step ]"),
        "steps/s2/tests/test.sh": grade(
            "[ \"$(cat /tmp/s2.txt)\" = 'top nobody from-solution-env noninteractive' ] && "
            "[ \"$(cat /tmp/s2-ls.txt)\" = solve.sh ] && grep -q out-of-s2 /logs/agent/oracle.txt"),
    })
    results, final = run_episode(task, Oracle(), backend=backend, agent=Oracle())
    assert [r.record.reward for r in results] == [1.0, 1.0]
    assert "out-of-s2" in results[1].record.output_tail


# SPEC: ORACLE-2
def test_oracle_2_non_zero_exit_only_recorded(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "solution/solve.sh": "#!/bin/bash\nexit 4\n",
                                 "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, Oracle(), agent=Oracle())
    assert results[0].record.exit_code == 4 and results[0].record.reward == 1.0


# SPEC: ORACLE-3, ORACLE-4
def test_oracle_3_step_solution_folder_without_solve_sh_is_unvalidatable(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "solution/solve.sh": "#!/bin/bash\ntrue\n",
        "steps/s2/solution/notes.txt": "no solve.sh here\n",
        "tests/test.sh": REWARD_1,
    })
    report = validate(task, {"backend": "docker"})
    assert not report.passed
    assert [(s.name, s.validatable, s.passed) for s in report.steps] == [("s1", True, True), ("s2", False, False)]
    assert [s.name for s in report.failing_steps()] == ["s2"]


# SPEC: ORACLE-4
def test_oracle_4_validate_examples_pass_and_broken_copy_names_the_step(tmp_path, envs_dir):
    assert validate(envs_dir / "cake").passed
    broken = tmp_path / "cake-broken"
    shutil.copytree(envs_dir / "cake", broken)
    (broken / "steps" / "02-select-frosting" / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho lemon > /app/cake/frosting.txt\n")
    report = validate(broken)
    assert not report.passed and [s.name for s in report.failing_steps()] == ["02-select-frosting"]
    cli = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "validate", str(broken)], capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode != 0 and "02-select-frosting" in cli.stdout + cli.stderr


# SPEC: ORACLE-4
def test_oracle_4_cli_validate_envs_passes(envs_dir):
    cli = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "validate", str(envs_dir)], capture_output=True,
                         text=True, timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
