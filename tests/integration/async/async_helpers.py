"""Helpers of the async tests: the label, the Docker config, task folders and agents (sync and async)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from task_folders import REWARD_0, grade, toml, write_task  # noqa: E402

from harbor_gym.agents import AgentOutcome  # noqa: E402

#: Unique to this test process, so that leak checks see only this run's containers.
TEST_LABEL = ("io.harbor-gym.test-async", uuid.uuid4().hex[:12])
DOCKER = {"backend": "docker", "labels": dict([TEST_LABEL]), "seed_retries": 0}


def labelled(client) -> list[str]:
    """Names of this process's containers (raw listing)."""
    return [c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": "=".join(TEST_LABEL)})]


def two_step_task(root: Path, name: str = "two-step") -> Path:
    """Steps a and b; step s scores 1 iff /app/s.txt holds 'ok'."""
    files = {"task.toml": toml(["a", "b"])}
    for step in ("a", "b"):
        files[f"steps/{step}/tests/test.sh"] = grade(f"grep -qx ok /app/{step}.txt")
    return write_task(root, files, name)


def broken_task(root: Path, name: str = "broken") -> Path:
    """A task whose image cannot be had (no alias, pull never): every reset fails, not retryable."""
    files = {"task.toml": toml(["a"]).replace('docker_image = "debian:bookworm-slim"',
                                              'docker_image = "harbor-gym-test/absent:never"'),
             "steps/a/tests/test.sh": REWARD_0}
    return write_task(root, files, name)


class AsyncWriter:
    """An async agent: awaits ``delay`` seconds (as a model call would), then writes 'ok' for the step with
    ``turn.aexec``."""

    name = "async-writer"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.turns = 0

    async def run(self, turn):
        await asyncio.sleep(self.delay)
        res = await turn.aexec(f"echo ok > /app/{turn.step_name}.txt")
        self.turns += 1
        return AgentOutcome(exit_code=res.exit_code, response=f"wrote {turn.step_name}")
