"""Helpers of the model-in-the-loop tests: a label for this process's containers, Docker configs and the fixture
tasks the scripted policy solves (SPEC GYM-13)."""

from __future__ import annotations

import uuid
from pathlib import Path

from task_folders import grade, toml, write_task

#: A label unique to this test process, so that leak checks see only this run's containers.
TEST_LABEL = ("io.harbor-gym.test", "agents-" + uuid.uuid4().hex[:10])
DOCKER = {"backend": "docker", "labels": dict([TEST_LABEL])}

#: Step instructions: the policy runs every "$ " line, one tool call each, then answers.
STEPS = {
    "s1": ("Make /app/a.txt hold alpha.\n$ echo alpha > /app/a.txt\n$ ls /app\n$ cat /app/a.txt\n",
           "[ \"$(cat /app/a.txt)\" = alpha ]"),
    "s2": ("Append beta to /app/a.txt.\n$ echo beta >> /app/a.txt\n$ tail -n 1 /app/a.txt\n",
           "[ \"$(sed -n 2p /app/a.txt)\" = beta ]"),
    "s3": ("Append gamma to /app/a.txt.\n$ echo gamma >> /app/a.txt\n",
           "[ \"$(sed -n 3p /app/a.txt)\" = gamma ]"),
}


def chat_task(root: Path, steps: int = 2, *, agent_timeout: float = 30, name: str = "chat-task") -> Path:
    """A task of ``steps`` steps (s1, s2, s3) that the ``policy`` model solves with several commands per turn."""
    names = list(STEPS)[:steps]
    files: dict = {"task.toml": toml(names, agent_timeout=agent_timeout)}
    for step in names:
        instruction, check = STEPS[step]
        files[f"steps/{step}/instruction.md"] = instruction
        files[f"steps/{step}/tests/test.sh"] = grade(check)
    return write_task(root, files, name)


def labelled(docker_client) -> list:
    return docker_client.containers.list(all=True, filters={"label": "=".join(TEST_LABEL)})
