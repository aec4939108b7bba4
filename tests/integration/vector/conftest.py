"""Fixtures of the vector-env tests: a label unique to this test process and the leak check."""

from __future__ import annotations

import time

import pytest

from vector_helpers import labelled


@pytest.fixture
def no_leaks(docker_client):
    """After the test nothing labelled remains (the vector env's close removed every sandbox and pool)."""
    yield
    deadline = time.monotonic() + 15
    while labelled(docker_client) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = labelled(docker_client)
    assert left == [], f"containers left behind: {left}"
