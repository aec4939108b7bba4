"""Fixtures of the vector-env tests: a label unique to this test process and the leak check."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ENVS = REPO / "envs"
#: Unique to this test process, so that leak checks see only this run's containers.
TEST_LABEL = ("io.harbor-gym.test-vector", uuid.uuid4().hex[:12])
DOCKER = {"backend": "docker", "labels": dict([TEST_LABEL]), "seed_retries": 0}


def labelled(client) -> list[str]:
    """Names of this process's containers (raw listing: no inspect racing a background teardown)."""
    return [c["Names"][0].lstrip("/") for c in client.api.containers(all=True, filters={"label": "=".join(TEST_LABEL)})]


@pytest.fixture
def no_leaks(docker_client):
    """After the test nothing labelled remains (the vector env's close removed every sandbox and pool)."""
    yield
    deadline = time.monotonic() + 15
    while labelled(docker_client) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = labelled(docker_client)
    assert left == [], f"containers left behind: {left}"
