"""``harbor-gym run`` bad input: a one-line error naming it and exit code 2, before any sandbox starts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harbor_gym.cli", "run", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("target", ["does-not-exist", "README.md"])
def test_path_that_is_not_a_task(target, tmp_path):
    proc = run_cli(target, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert target in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_folder_without_tasks(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli(str(tmp_path / "empty"))
    assert proc.returncode == 2 and "no task folder" in proc.stderr


def test_unknown_agent(tmp_path):
    proc = run_cli("envs/cake", "--agent", "frobnicator", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "frobnicator" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_task_that_fails_to_load(tmp_path):
    # SPEC: LOAD-3
    task = tmp_path / "broken"
    shutil.copytree(REPO / "envs" / "cake", task)
    shutil.rmtree(task / "steps" / "02-select-frosting")
    proc = run_cli(str(task), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "broken" in proc.stderr and "LOAD-3" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", [["-k", "0"], ["-c", "0"], ["--retries", "-1"], ["--label", "novalue"]])
def test_out_of_range_options(flag, tmp_path):
    proc = run_cli("envs/cake", *flag, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
