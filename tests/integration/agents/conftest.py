"""Fixtures of the model-in-the-loop tests: the scripted policy server and leak checks by label."""

from __future__ import annotations

import pytest

from agents_helpers import labelled
from policy_server import PolicyServer


@pytest.fixture(scope="session")
def policy_server():
    """The scripted OpenAI-protocol policy server on 127.0.0.1 (one per test session)."""
    server = PolicyServer().start()
    yield server
    server.stop()


@pytest.fixture
def server(policy_server):
    """The session's server with its request log emptied for this test."""
    policy_server.requests.clear()
    policy_server.auth.clear()
    return policy_server


@pytest.fixture
def no_leaks(docker_client):
    """Nothing labelled with this process's test label is left once the test is done."""
    yield
    left = labelled(docker_client)
    for c in left:
        c.remove(force=True)
    assert left == [], f"containers left behind: {[c.name for c in left]}"
