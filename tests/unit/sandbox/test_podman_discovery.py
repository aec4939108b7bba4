"""Podman's pure parts (issue 17 item 2): which limits an engine refuses, its host rules and names (never
Docker's), and the reaper's mount of the socket's folder."""

from __future__ import annotations

import logging

import pytest

from harbor_gym.sandbox import _netfilter, _podman, _podman_net
from harbor_gym.sandbox.base import SandboxSpec

ROOTLESS_V1 = _podman.PodmanEngine(url="unix:///run/user/1001/harbor-gym/podman/podman.sock", how="test",
                                   rootless=True, cgroup_version="v1", controllers=frozenset(), version="4.3.1")
ROOTFUL_V1 = _podman.PodmanEngine(url="unix:///run/harbor-gym/podman/podman.sock", how="test", rootless=False,
                                  cgroup_version="v1", controllers=frozenset({"cpu", "memory", "pids"}),
                                  version="4.3.1")


class _Marked:
    """A stand-in client carrying its engine as `podman_client` marks real ones."""

    def __init__(self, engine):
        setattr(self, "_harbor_gym_podman", engine)


# SPEC: LOAD-24 (issue 17 item 2): cpus and memory_mb the engine cannot apply are refused, never dropped
def test_load_24_rootless_cgroup_v1_refuses_cpus_and_memory():
    spec = SandboxSpec(image="x", cpus=0.5, memory_mb=256, pids_limit=100)
    refused = _podman.limit_refusals(spec, ROOTLESS_V1)
    assert [r.split(" ")[0] for r in refused] == ["cpus=0.5", "memory_mb=256"]
    assert all("rootless podman 4.3.1 on cgroup v1" in r for r in refused)
    assert _podman.limit_refusals(spec, ROOTFUL_V1) == []
    assert _podman.limit_refusals(SandboxSpec(image="x", pids_limit=100), ROOTLESS_V1) == []  # pids: not a task's


def test_pids_limit_not_applied_is_logged_once_per_engine(caplog):
    engine = ROOTLESS_V1.__class__(**{**ROOTLESS_V1.__dict__, "url": "unix:///tmp/unique-for-this-test.sock"})
    with caplog.at_level(logging.WARNING, logger="harbor_gym.sandbox"):
        _podman.warn_unapplied(SandboxSpec(image="x", pids_limit=4096), engine)
        _podman.warn_unapplied(SandboxSpec(image="x", pids_limit=4096), engine)
        _podman.warn_unapplied(SandboxSpec(image="x", pids_limit=4096), ROOTFUL_V1)  # applied there: silent
    warned = [r for r in caplog.records if "pids_limit=4096 is not applied" in r.getMessage()]
    assert len(warned) == 1


def test_podman_bridges_never_take_dockers_names():
    # the earlier attempt's failure: a podman network on Docker's bridge name made podman delete Docker's bridge
    assert _podman_net.BRIDGE_IFACE != _netfilter.BRIDGE_IFACE and _podman_net.PUBLIC_NETWORK != _netfilter.PUBLIC_NETWORK
    name = _podman_net.group_bridge_name(_Marked(ROOTFUL_V1))
    assert name.startswith("hgp-g") and len(name) <= 15
    assert not name.startswith(_netfilter.GROUP_IFACE_PREFIX) and not name.startswith("hg-")
    assert _podman_net.group_bridge_name(object()).startswith(_netfilter.GROUP_IFACE_PREFIX)  # Docker's own


def test_gym_10_filter_rules_keep_podman_bridges_off_the_host_and_apart():
    # SPEC: GYM-10
    rules = _podman_net.filter_rules(["eth0"])
    chain = lambda name: [r for b, c, r in rules if c == name and b == "iptables"]  # noqa: E731
    assert chain("INPUT") == [["-i", "hgp-+", "-j", _podman_net.INPUT_CHAIN]]
    own = chain(_podman_net.INPUT_CHAIN)
    assert own[-1] == ["-j", "DROP"] and all(r[1] == "hgp-g+" and "53" in r for r in own[:-1])  # DNS only
    for name in (_podman_net.INPUT_CHAIN, _podman_net.OUT_CHAIN, _podman_net.IN_CHAIN):
        # everything before the final DROP is an exit, so inserting a missing rule first never reorders a decision
        assert chain(name)[-1] == ["-j", "DROP"] and all(r[-1] in ("ACCEPT", "RETURN") for r in chain(name)[:-1])
    assert ["-o", "eth0", "-j", "RETURN"] in chain(_podman_net.OUT_CHAIN)
    assert any("--physdev-is-bridged" in r for r in chain(_podman_net.OUT_CHAIN))  # within one group only
    assert ("ip6tables", "INPUT", ["-i", "hgp-+", "-j", "DROP"]) in rules


def test_reaper_mounts_the_sockets_folder(monkeypatch):
    monkeypatch.delenv("HARBOR_GYM_REAPER_SOCKET", raising=False)
    binds, env = _podman.reaper_mount(_Marked(ROOTFUL_V1))
    assert binds == {"/run/harbor-gym/podman": {"bind": _podman.REAPER_ENGINE_DIR, "mode": "rw"}}
    assert env == {"HARBOR_GYM_REAPER_ENGINE_SOCKET": f"{_podman.REAPER_ENGINE_DIR}/podman.sock"}
    attrs = {"Mounts": [{"Source": "/run/harbor-gym/podman", "Destination": _podman.REAPER_ENGINE_DIR}]}
    assert _podman.reaper_mount_current(_Marked(ROOTFUL_V1), attrs)
    assert not _podman.reaper_mount_current(_Marked(ROOTLESS_V1), attrs)  # another service's folder: recreated
    assert _podman.reaper_mount(object()) is None  # a Docker engine: the Docker socket as before


def test_container_host_of_another_scheme_is_refused(monkeypatch):
    monkeypatch.setenv("CONTAINER_HOST", "ssh://core@host/run/podman/podman.sock")
    with pytest.raises(Exception, match="unix:// and tcp:// only"):
        _podman._connect()
