"""Issue 17 item 1, the pure parts: placement (least in-flight episodes, ties to the first listed), outages (out for
the probe interval, probed again, back when answering), the config's engine fields, remote judgement and gc's
judgement of a remote engine's leases."""

from __future__ import annotations

import time

import docker
import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError, SandboxUnavailableError
from harbor_gym.sandbox import gc
from harbor_gym.sandbox._engine import engine_key, is_remote
from harbor_gym.sandbox.engines import EngineSet


class FakePing:
    def __init__(self) -> None:
        self.down: set[str] = set()
        self.calls: list[str] = []

    def __call__(self, engine) -> str | None:
        self.calls.append(engine.url)
        return "refused" if engine.url in self.down else None


def test_least_in_flight_first_ties_to_the_first_listed():
    engines = EngineSet(["tcp://a:1", "tcp://b:1", "tcp://c:1"], ping=FakePing())
    placed = [engines.acquire().url for _ in range(6)]
    assert placed == ["tcp://a:1", "tcp://b:1", "tcp://c:1"] * 2
    b = engines.engines[1]
    engines.release(b)
    engines.release(b)
    assert engines.acquire() is b and engines.acquire() is b  # b now has the fewest in flight
    assert engines.acquire().url == "tcp://a:1"


def test_an_engine_out_is_skipped_then_probed_again_after_the_interval():
    ping = FakePing()
    engines = EngineSet(["tcp://a:1", "tcp://b:1"], probe_interval_s=0.2, ping=ping)
    a = engines.engines[0]
    ping.down.add(a.url)
    assert engines.check(a) == "engine tcp://a:1 does not answer (refused)"
    assert [engines.acquire().url for _ in range(3)] == ["tcp://b:1"] * 3  # out: never placed, not probed
    assert ping.calls == ["tcp://a:1"]
    time.sleep(0.25)
    assert engines.acquire().url == "tcp://b:1"  # probed: still down, out for another interval
    assert ping.calls == ["tcp://a:1", "tcp://a:1"]
    ping.down.clear()
    time.sleep(0.25)
    assert engines.acquire() is a  # probed, answers: back, and it has the fewest in flight
    assert engines.status()[0]["in_service"] is True


def test_every_engine_out_names_each_cause():
    ping = FakePing()
    engines = EngineSet(["tcp://a:1", "tcp://b:1"], ping=ping)
    ping.down.update({"tcp://a:1", "tcp://b:1"})
    for e in engines.engines:
        engines.check(e)
    with pytest.raises(SandboxUnavailableError) as info:
        engines.acquire()
    assert info.value.retryable
    assert "engine tcp://a:1 does not answer" in str(info.value) and "engine tcp://b:1" in str(info.value)


def test_a_socket_defaults_to_the_unix_path_or_the_remote_hosts_default():
    engines = EngineSet(["unix:///run/x.sock", "tcp://h:2376", "ssh://u@h"], {"ssh://u@h": "/run/d.sock"})
    assert [e.socket for e in engines.engines] == ["/run/x.sock", "/var/run/docker.sock", "/run/d.sock"]


@pytest.mark.parametrize("bad, words", [
    ({"engines": ["http://h:1"]}, "not a Docker host URL"),
    ({"engines": ["tcp://h:1", "tcp://h:1"]}, "listed twice"),
    ({"engines": ["tcp://h:1"], "backend": "local"}, "backend 'local'"),
    ({"engines": ["tcp://h:1"], "engine_sockets": {"tcp://g:1": "/s"}}, "not one of engines"),
])
def test_config_refuses_bad_engine_fields(bad, words):
    with pytest.raises(ConfigError, match=words):
        EnvConfig.coerce(bad)


def test_remote_is_by_transport():
    local = docker.DockerClient(base_url="unix:///run/nothing.sock", version="1.41")
    remote = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.41")
    assert not is_remote(local) and is_remote(remote)
    assert engine_key(local) == "unix:///run/nothing.sock" and engine_key(remote) == "tcp://127.0.0.1:9"


def test_gc_judges_a_remote_engines_resources_by_its_reapers_leases():
    labels = {"io.harbor-gym.run": "r1", "io.harbor-gym.lease": "r1", "io.harbor-gym.lease-ttl": "30"}
    now = time.time()
    assert not gc._dead(labels, {"r1": f"{now - 5:.3f}"}, age_s=100)  # renewed by some host: live
    assert gc._dead(labels, {"r1": f"{now - 45:.3f}"}, age_s=100)  # not renewed for ttl + allowance: dead
    assert gc._dead(labels, {"r1": "released"}, age_s=1)
    assert not gc._dead(labels, {}, age_s=5)  # not recorded yet, young: a run that is starting
    assert gc._dead(labels, {}, age_s=100)
