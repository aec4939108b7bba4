"""`harbor-gym check`: one line per task, exit 0 when all load, 1 when one is refused, 2 for unreadable input."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harbor_gym.cli", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def test_check_envs_exits_0_and_lists_every_example():
    proc = run_cli("check", "envs/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    examples = sorted(p.name for p in (REPO / "envs").iterdir() if (p / "task.toml").is_file())
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(examples)
    for name, line in zip(examples, lines):
        assert line.startswith("OK") and name in line


def test_check_broken_task_prints_problem_and_exits_1(tmp_path):
    # SPEC: LOAD-3 — a declared step without its folder.
    task = tmp_path / "broken"
    shutil.copytree(REPO / "envs" / "cake", task)
    shutil.rmtree(task / "steps" / "02-select-frosting")
    proc = run_cli("check", str(task))
    assert proc.returncode == 1
    assert "FAIL broken" in proc.stdout
    assert "LOAD-3" in proc.stdout and "02-select-frosting" in proc.stdout


def test_check_dataset_reports_the_broken_task_and_still_checks_the_rest(tmp_path):
    shutil.copytree(REPO / "envs" / "cake", tmp_path / "good")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.toml").write_text("this is = not toml [")
    proc = run_cli("check", str(tmp_path))
    assert proc.returncode == 1
    assert "OK   good" in proc.stdout
    assert "FAIL bad" in proc.stdout and "LOAD-1" in proc.stdout


@pytest.mark.parametrize("target", ["does-not-exist", "README.md"])
def test_check_unreadable_input_exits_2_with_one_line(target):
    proc = run_cli("check", target)
    assert proc.returncode == 2
    assert target in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_bad_usage_exits_2():
    assert run_cli("frobnicate").returncode == 2
    assert run_cli("check").returncode == 2
