"""Helpers for the Gymnasium-face tests: docker-backed configs and reference scripts."""

from __future__ import annotations

import uuid
from pathlib import Path

from harbor_gym.task import load_task

REPO = Path(__file__).resolve().parents[3]
ENVS = REPO / "envs"
#: A label unique to this test process, so that leak checks see only this run's containers (other runs may share
#: the engine).
TEST_LABEL = ("io.harbor-gym.test", uuid.uuid4().hex[:12])
DOCKER = {"backend": "docker", "labels": dict([TEST_LABEL])}


def solution_script(example: str, step_name: str) -> str:
    """The text of the reference solve.sh the oracle would run for ``step_name`` (ORACLE-1), as a script action."""
    task = load_task(ENVS / example)
    step = task.step(step_name)
    return (step.solution_dir / "solve.sh").read_text()


def solution_scripts(example: str) -> list[str]:
    task = load_task(ENVS / example)
    return [(s.solution_dir / "solve.sh").read_text() for s in task.steps]


def labelled_containers(docker_client) -> list:
    """This test process's containers (all states)."""
    return docker_client.containers.list(all=True, filters={"label": "=".join(TEST_LABEL)})
