"""Constants and scripts for the vector-env tests (label, config, leak listing), the reference solutions of envs/ and a seeded random-script policy."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np

from harbor_gym.task import load_task

REPO = Path(__file__).resolve().parents[3]
ENVS = REPO / "envs"
#: Unique to this test process, so that leak checks see only this run's containers.
TEST_LABEL = ("io.harbor-gym.test-vector", uuid.uuid4().hex[:12])
DOCKER = {"backend": "docker", "labels": dict([TEST_LABEL]), "seed_retries": 0}


def labelled(client) -> list[str]:
    """Names of this process's containers (raw listing: no inspect racing a background teardown)."""
    return [c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": "=".join(TEST_LABEL)})]


def solutions(example: str, root: Path = ENVS) -> dict[str, str]:
    """step name -> the script the oracle would run for it (the step's solve.sh, else the task's; ORACLE-1)."""
    task = load_task(root / example)
    out = {}
    for step in task.steps:
        folder = step.solution_dir if step.solution_dir is not None else task.path / "solution"
        out[step.name] = (folder / "solve.sh").read_text()
    return out


class RandomScriptPolicy:
    """Per sub-env, a seeded choice between the step's reference script (p=0.7) and a no-op ``:``.

    Only plain ``str`` actions leave the driver, so the same seeds give the same actions wherever the envs live.
    """

    def __init__(self, num_envs: int, seed: int, scripts: dict[str, dict[str, str]]) -> None:
        self.rngs = [np.random.default_rng(seed + i) for i in range(num_envs)]
        self.scripts = scripts

    def __call__(self, obs: dict) -> list[str]:
        actions = []
        for i, rng in enumerate(self.rngs):
            correct = self.scripts[obs["task_id"][i]].get(obs["step_name"][i], ":")
            actions.append(correct if rng.random() < 0.7 else ":")
        return actions
