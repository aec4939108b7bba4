"""Helpers of the ``harbor-gym run`` tests (the CLI as a subprocess, rows, labelled containers)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENVS = REPO / "envs"
#: Unique to this test process, so that leak checks see only this run's containers.
LABEL = ("io.harbor-gym.test", "run-" + uuid.uuid4().hex[:12])


def cli_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "harbor_gym.cli", "run", *args, "--label", "=".join(LABEL)]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``harbor-gym run ARGS --label <test label>`` to completion."""
    return subprocess.run(cli_args(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def labelled(docker_client) -> list[dict]:
    """This test process's containers (all states), as the engine's list entries (``Id``, ``Names``, ``State``).

    One list call (the low-level API): a container removed meanwhile cannot make it fail."""
    return docker_client.api.containers(all=True, filters={"label": "=".join(LABEL)})
