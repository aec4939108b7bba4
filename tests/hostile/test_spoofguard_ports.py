"""GYM-10: the spoofing guard's bindings are keyed by interface index, so what a SIGKILLed run left never applies to
another sandbox's port that reuses the name (podman's netavark names host veths veth0, veth1, ... and reuses a freed
name at once). Real interfaces and the real nftables table on this host; no container needed."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from harbor_gym.sandbox import _spoofguard

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None,
                                reason="the spoofing guard needs root and nft")

BRIDGE, PORT, PEER, ADDR = "hgtr0", "hgtrv0", "hgtrp0", "10.250.0.2"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _veth() -> tuple[int, str]:
    _ip("link", "add", PORT, "type", "veth", "peer", "name", PEER)
    _ip("link", "set", PORT, "master", BRIDGE, "up")
    index = int(open(f"/sys/class/net/{PORT}/ifindex").read())
    mac = open(f"/sys/class/net/{PEER}/address").read().strip()
    return index, mac


def _bound(index: int) -> bool:
    return subprocess.run(["nft", "get", "element", "bridge", _spoofguard.TABLE, "ports", f"{{ {index} }}"],
                          capture_output=True).returncode == 0


@pytest.fixture
def bridge():
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", BRIDGE, "up")
    try:
        yield
    finally:
        _ip("link", "del", PORT, check=False)
        _ip("neigh", "del", ADDR, "dev", BRIDGE, check=False)
        _ip("link", "del", BRIDGE, check=False)


# SPEC: GYM-10 (no sandbox may send as another: a dead run's binding never covers a new port of the same name)
def test_a_dead_runs_binding_never_applies_to_a_new_port_of_the_same_name(bridge):
    old_index, mac = _veth()
    _spoofguard.bind(_spoofguard.Binding(port=PORT, bridge=BRIDGE, mac=mac, ipv4=ADDR, ifindex=old_index))
    assert _bound(old_index)
    _ip("link", "del", PORT)  # the run was SIGKILLed: its sandbox's veth vanished, nothing was unbound
    new_index, _ = _veth()  # another sandbox's port gets the same name at once
    assert new_index != old_index
    assert not _bound(new_index), "the dead run's elements apply to the new port of the same name"
    listed = _spoofguard._list_table()
    assert str(old_index) in listed["ports"]  # left over, listed by number: it matches no port that exists
    _spoofguard._prune()
    assert str(old_index) not in _spoofguard._list_table()["ports"]
    assert not any(isinstance(e, list) and e[0] == str(old_index) for e in _spoofguard._list_table()["ip4_ok"])


# SPEC: GYM-10 (a bound port's own elements stay through a prune; unbind removes them and the neighbour entry)
def test_prune_keeps_a_live_binding_and_unbind_removes_it(bridge):
    index, mac = _veth()
    binding = _spoofguard.Binding(port=PORT, bridge=BRIDGE, mac=mac, ipv4=ADDR)  # index read from sysfs
    assert binding.ifindex == index
    _spoofguard.bind(binding)
    _spoofguard._prune()
    assert _bound(index)
    assert "PERMANENT" in _ip("neigh", "show", ADDR, "dev", BRIDGE).stdout
    _spoofguard.unbind(binding)
    assert not _bound(index)
    assert _ip("neigh", "show", ADDR, "dev", BRIDGE).stdout.strip() == ""
