"""Fixtures of the capture proxy's tests (issue 18): the scripted OpenAI-protocol policy server as upstream, a
proxy in front of it on 127.0.0.1 and sessions with an open window. Real HTTP, no Docker."""

from __future__ import annotations

import pytest

from policy_server import PolicyServer
from proxy_helpers import KEY_ENV, UPSTREAM_KEY, make_proxy

from harbor_gym.agents._chat_wire import RefusedOptions


@pytest.fixture(scope="session")
def upstream_server():
    server = PolicyServer().start()
    yield server
    server.stop()


@pytest.fixture
def upstream(upstream_server, monkeypatch):
    """The policy server with its logs emptied, and the key in the host's environment."""
    monkeypatch.setenv(KEY_ENV, UPSTREAM_KEY)
    for log in (upstream_server.requests, upstream_server.auth, upstream_server.disconnects):
        log.clear()
    RefusedOptions.forget(upstream_server.url)
    yield upstream_server
    RefusedOptions.forget(upstream_server.url)


@pytest.fixture(scope="module")
def proxy(upstream_server):
    """One proxy (default caps) in front of the policy server for the module's tests."""
    p = make_proxy(upstream_server.url)
    yield p
    p.close()


@pytest.fixture
def session(proxy, upstream):
    """A session of ``proxy`` with turn 0's window open; closed after the test."""
    s = proxy.open_session(label="test")
    s.begin_activation(0)
    yield s
    s.close()
