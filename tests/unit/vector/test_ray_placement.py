"""The Ray sub-env's node-loss and placement errors, without a cluster (a stand-in for the ``ray`` module whose
actor calls fail as Ray's do): a lost actor's call names the node it was placed on (issue 17 item 3)."""

from __future__ import annotations

import types

import pytest

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.vector import _placement, _ray

ray = pytest.importorskip("ray")


class _DeadRef:
    pass


class _Method:
    def remote(self, *args):
        return _DeadRef()


class _DeadActor:
    step = reset = close = open = _Method()


def _fake_ray(total: dict[str, float]):
    def get(ref, timeout=None):
        raise ray.exceptions.ActorUnavailableError("the actor is unreachable: Socket closed", b"\0" * 16)

    return types.SimpleNamespace(get=get, exceptions=ray.exceptions, kill=lambda actor: None,
                                 cluster_resources=lambda: dict(total))


def test_gym_2_lost_actor_is_an_outage_naming_its_node(monkeypatch):
    # SPEC: GYM-2, STOP-8 — a call to an actor whose node is gone raises a retryable SandboxUnavailableError that
    # names the node (id and IP) it was placed on; the next step of that sub-env is refused the same way.
    monkeypatch.setattr(_ray, "ray_module", lambda: _fake_ray({}))
    sub = _ray.RaySubEnv.__new__(_ray.RaySubEnv)
    sub._actor, sub._dead, sub._where_ref = _DeadActor(), False, None
    sub.node = {"node_id": "abc123", "ip": "10.1.2.3", "docker_host": "unix:///x"}
    with pytest.raises(SandboxUnavailableError) as err:
        sub.step(":")
    assert err.value.retryable and "abc123" in str(err.value) and "10.1.2.3" in str(err.value)
    assert "ActorUnavailableError" in str(err.value)
    with pytest.raises(SandboxUnavailableError, match="abc123"):
        sub.step(":")


def test_unplaced_error_names_demand_and_offer():
    # The placement bound's error says what was asked, what the cluster declares, and how to declare it.
    fake = _fake_ray({"harbor_engine": 1.0, "CPU": 2.0})
    err = _placement.unplaced_error(fake, {"harbor_engine": 1.0}, timeout_s=3, what="2 actors", count=2)
    text = str(err)
    assert err.retryable and "2 x {harbor_engine=1}" in text and "{harbor_engine=1}" in text
    assert "--resources" in text and "DOCKER_HOST" in text
    with pytest.raises(SandboxUnavailableError, match="nowhere"):
        _placement.wait_offered(fake, {"nowhere": 1.0}, timeout_s=0.1, what="x")
    _placement.wait_offered(fake, {"harbor_engine": 1.0}, timeout_s=0.1, what="x")  # offered: returns at once
