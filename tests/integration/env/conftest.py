"""Fixtures for the Gymnasium-face tests."""

from __future__ import annotations

import pytest

from env_helpers import labelled_containers


@pytest.fixture
def no_leaks(docker_client):
    """Assert that nothing labelled is left once the test is done (the env must have closed everything)."""
    yield
    left = labelled_containers(docker_client)
    assert left == [], f"containers left behind: {[c.name for c in left]}"
