"""GYM-12: `DockerOutageMixin.outage_report` on a canned engine: the engine's evidence decides, a restarted or
unreachable engine and a sandbox we stopped are never the agent's doing."""

from __future__ import annotations

import docker.errors
import pytest

from harbor_gym.sandbox._docker_outage import DockerOutageMixin
from harbor_gym.sandbox.base import ExecResult, SandboxSettings, SandboxState


class _Api:
    def __init__(self, *, ping=True, state=None, events=(), removed=False):
        self._ping, self._state, self._events, self._removed = ping, state, list(events), removed

    def ping(self):
        if not self._ping:
            raise ConnectionError("engine down")
        return True

    def inspect_container(self, cid):
        if self._removed:
            raise docker.errors.NotFound("gone")
        return {"State": self._state or {}}

    def events(self, **kwargs):
        assert kwargs["filters"]["container"] == "cid" and kwargs["until"] > kwargs["since"]
        return iter(self._events)


class _Client:
    def __init__(self, api):
        self.api = api


class _Box(DockerOutageMixin):
    def __init__(self, api, *, probe_ok=True, state=SandboxState.RUNNING):
        self.name, self.container_id, self.run_id = "hg-x", "cid", None
        self.settings, self._state, self._client, self._probe_ok = SandboxSettings(), state, _Client(api), probe_ok

    @property
    def client(self):
        return self._client

    def _count(self, n=1):
        pass

    def exec(self, command, **kwargs):
        return ExecResult(exit_code=0 if self._probe_ok else 126)


def _die(code):
    return {"Action": "die", "Actor": {"Attributes": {"exitCode": str(code)}}}


# SPEC: GYM-12
@pytest.mark.parametrize("api, probe_ok, want", [
    (_Api(removed=True, events=[_die(137)]), True, "died (exit 137)"),                  # killed, auto-removed
    (_Api(state={"Running": False, "OOMKilled": True}, events=[_die(137)]), True, "oom_killed"),
    (_Api(removed=True, events=[{"Action": "oom"}, _die(137)]), True, "oom_killed"),
    (_Api(state={"Running": True}), False, "cannot_run_commands"),                     # pids or memory exhausted
    (_Api(state={"Running": True}), True, None),                                       # it runs commands
    (_Api(removed=True, events=[]), True, None),                                       # restarted engine: no event
    (_Api(ping=False, removed=True, events=[_die(137)]), True, None),                  # unreachable engine
    (_Api(removed=True, events=[{"Action": "kill"}, _die(137)]), True, None),         # killed through the API
], ids=["died", "oom-state", "oom-event", "no-commands", "fine", "engine-restarted", "engine-down", "api-kill"])
def test_gym_12_outage_report_from_engine_evidence(api, probe_ok, want):
    assert _Box(api, probe_ok=probe_ok).outage_report() == want


# SPEC: GYM-12 (a sandbox this process stopped is never the agent's doing)
def test_gym_12_outage_report_of_a_stopped_sandbox_is_none():
    assert _Box(_Api(removed=True, events=[_die(137)]), state=SandboxState.STOPPED).outage_report() is None
