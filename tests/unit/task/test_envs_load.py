"""Every shipped example task in envs/ loads, round-trips, and keeps its instructions canary-free."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from harbor_gym.task import UnknownKeyWarning, dump_task_toml, load_task, parse_task_toml

ENVS_DIR = Path(__file__).resolve().parents[3] / "envs"
EXAMPLES = sorted(p for p in ENVS_DIR.iterdir() if (p / "task.toml").is_file()) if ENVS_DIR.is_dir() else []


def test_there_are_examples():
    assert EXAMPLES, f"no example task folders in {ENVS_DIR}"


@pytest.mark.parametrize("folder", EXAMPLES, ids=lambda p: p.name)
def test_envs_example_loads(folder, tmp_path):
    # SPEC: GYM-1, LOAD-1..16 — shipped examples are valid, warn about nothing, and round-trip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownKeyWarning)
        task = load_task(folder)
    assert task.id == folder.name and task.steps
    assert all(step.instruction.strip() and "canary" not in step.instruction.lower() for step in task.steps)
    (tmp_path / "task.toml").write_text(dump_task_toml(task.config))
    assert parse_task_toml(tmp_path / "task.toml") == task.config
