"""Fixtures of the async tests (issue 15): a label unique to this test process, small task folders and the leak
check (nothing labelled remains once a test is done)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from async_helpers import labelled, two_step_task


@pytest.fixture
def no_leaks(docker_client):
    """After the test nothing labelled with this process's label remains."""
    yield
    deadline = time.monotonic() + 20
    while labelled(docker_client) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = labelled(docker_client)
    for name in left:
        try:
            docker_client.containers.get(name).remove(force=True)
        except Exception:
            pass
    assert left == [], f"containers left behind: {left}"


@pytest.fixture
def task(tmp_path, warm_engine) -> Path:
    """A 2-step task: each step's verifier gives 1 iff /app/<step>.txt holds 'ok'."""
    return two_step_task(tmp_path)


@pytest.fixture(scope="session")
def warm_engine(tmp_path_factory):
    """One episode's seed before any concurrent test, so that the process's one-time engine probes (storage
    limits) are not raced by 16 threads on a loaded engine."""
    from harbor_gym import HarborEnv

    from async_helpers import DOCKER

    env = HarborEnv(two_step_task(tmp_path_factory.mktemp("warm")), config=DOCKER)
    try:
        env.reset(seed=0)
    finally:
        env.close()
