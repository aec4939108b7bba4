"""The spoofing guard: every sandbox's bridge port is bound to its own MAC and IPv4 address (SPEC GYM-10: sandboxes
cannot reach each other, so none may send as another).

On a shared bridge (``hg-public0``, ``hg-proxy0``, ``hg-local0``) a root process in sandbox A could otherwise forge
its source: a gratuitous ARP (or an ARP request to the gateway) carrying B's address moves the host's neighbour entry
for B to A's MAC, so B's egress replies reach A; a forged IPv4 source lets A send as B. The guard is one nftables
table of harbor_gym's own, in the ``bridge`` family (nothing else touches it)::

    table bridge harbor_gym_guard2
      set ports      { iface_index }                              bound ports (host ends of sandbox veths)
      set arp_ok     { iface_index . ether_addr . ether_addr . ipv4_addr } port . frame MAC . ARP sender MAC . IP
      set ip4_ok     { iface_index . ether_addr . ipv4_addr }     port . frame MAC . IPv4 source
      set isolated   { iface_index }                              bound ports of shared bridges (no port-to-port)
      set routed_ports { iface_index }, routed_ok { iface_index . ipv4_addr }  ports that may send IPv4 to one address
      chain prerouting (hook prerouting): iif @ports jump port_in
      chain port_in: Ethernet/IPv4 ARP matching @arp_ok -> return; IPv4 from a routed port to an address not in
                     @routed_ok -> drop; IPv4 matching @ip4_ok -> return; else drop
      chain forward (hook forward): iif @isolated drop

Ports are keyed by interface *index*, which the kernel never hands out twice (until its 32-bit counter wraps), not
by name: podman's netavark names host veths ``veth0``, ``veth1``, ... and reuses a freed name at once, so a binding
keyed by name that a SIGKILLed run left would have applied to another sandbox's new port of that name (letting it
send as the dead sandbox's address, which IPAM may have given to a live one) until that port's own bind. The index
comes from the kernel's peer link of the sandbox's interface (`netns_ports`), never from a name lookup.

So from a bound port only frames with the port's own MAC pass, and of them only ARP whose sender MAC and IP are the
port's own and IPv4 whose source is the port's own: IPv6 (none of harbor_gym's networks carries it; the host drops
it at layer 3 too), VLAN-tagged frames and every other ethertype are dropped. The drop sits in the bridge's
prerouting hook, before the bridge learns the frame's source MAC and before the host's ARP code sees it. Frames
between two bound ports of a shared bridge are dropped at the bridge's forward hook (a second wall beside Docker's
``icc=false`` and the local bridge's port isolation, for every ethertype). Ports of compose groups' own bridges
(``hgg-*``) are bound too but not isolated: a group's services talk to each other. A *routed* port (a sandbox
without a network that may reach one host service, `harbor_gym.sandbox.host_route`) sends IPv4 to its bridge's own
address only: nothing it sends is forwarded anywhere, whatever routes or raw frames it makes.

`bind` also makes the host's neighbour entry of the sandbox's address permanent (``ip neigh replace ... nud
permanent``: no ARP, forged or not, changes it) and adds a static forwarding entry for its MAC on its port (the
bridge never floods frames meant for it to the other ports). The elements and the forwarding entry are keyed by the
port, which vanishes with its sandbox; `unbind` removes the elements and the neighbour entry (if it still names the
sandbox's MAC). What a SIGKILLed run leaves is harmless and replaced: a later sandbox that gets the same address
replaces the neighbour entry at its `bind`, elements of vanished ports match nothing (no port ever gets their index
again) and are pruned at the next process's first `ensure`, and permanent neighbour entries on harbor_gym's bridges
that no live binding names are deleted then too. The name-keyed table of earlier versions (``harbor_gym_guard``)
is deleted at `ensure` once none of its ports exists.

Ports that were never bound are not filtered (policy accept): the guard must not cut off a sandbox that predates it
(or another tool's port), and every harbor_gym sandbox is bound at start before any command of the agent runs.
Where the guard cannot be installed (not root, no ``nft``, a kernel without nftables' bridge family)
`unavailable_reason` says why; the callers then treat the network as unfiltered (GYM-10: refused unless
``unfiltered_network="allow"``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

from harbor_gym.errors import SandboxUnavailableError

__all__ = ["TABLE", "LEGACY_TABLE", "Binding", "unavailable_reason", "ensure", "bind", "unbind", "host_port", "netns_ports"]

log = logging.getLogger("harbor_gym.sandbox")

#: The nftables table of the guard (family ``bridge``).
TABLE = "harbor_gym_guard2"
#: The name-keyed table of earlier versions (deleted once none of its ports exists).
LEGACY_TABLE = "harbor_gym_guard"
#: Bridges of harbor_gym's: ``hg-*`` (shared ones), ``hgg-*`` (compose groups) and podman's ``hgp-*``; neighbour
#: entries are pruned here.
_OUR_BRIDGE = re.compile(r"^hg[gp]?-[A-Za-z0-9-]+$")
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_TIMEOUT_S = 20.0
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_PORT = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")

_SKELETON = f"""\
add table bridge {TABLE}
add set bridge {TABLE} ports {{ type iface_index; }}
add set bridge {TABLE} arp_ok {{ type iface_index . ether_addr . ether_addr . ipv4_addr; }}
add set bridge {TABLE} ip4_ok {{ type iface_index . ether_addr . ipv4_addr; }}
add set bridge {TABLE} isolated {{ type iface_index; }}
add set bridge {TABLE} routed_ports {{ type iface_index; }}
add set bridge {TABLE} routed_ok {{ type iface_index . ipv4_addr; }}
add chain bridge {TABLE} prerouting {{ type filter hook prerouting priority -200; policy accept; }}
add chain bridge {TABLE} port_in
add chain bridge {TABLE} forward {{ type filter hook forward priority -200; policy accept; }}
flush chain bridge {TABLE} prerouting
flush chain bridge {TABLE} port_in
flush chain bridge {TABLE} forward
add rule bridge {TABLE} prerouting iif @ports jump port_in
add rule bridge {TABLE} port_in ether type arp arp htype 1 arp ptype ip arp hlen 6 arp plen 4 \
iif . ether saddr . arp saddr ether . arp saddr ip @arp_ok return
add rule bridge {TABLE} port_in ether type ip iif @routed_ports iif . ip daddr != @routed_ok counter drop
add rule bridge {TABLE} port_in ether type ip iif . ether saddr . ip saddr @ip4_ok return
add rule bridge {TABLE} port_in counter drop
add rule bridge {TABLE} forward iif @isolated counter drop
"""

_lock = threading.Lock()
_ensured = False


@dataclass(frozen=True)
class Binding:
    """One sandbox port bound to its MAC and IPv4 address.

    Attributes:
        port: the host end of the sandbox's veth (a port of ``bridge``), by name (for the forwarding entry and
            messages).
        ifindex: that port's interface index, the key of its elements (default: read from sysfs by ``port``).
        bridge: the bridge interface it is a port of.
        mac: the sandbox interface's MAC (lower case, colon separated).
        ipv4: the sandbox interface's IPv4 address.
        isolated: drop frames from this port to every other port of the bridge (shared bridges).
        routed_to: if set, the only IPv4 destination the port may send to (its bridge's address: a sandbox that
            reaches one host service and nothing else).
    """

    port: str
    bridge: str
    mac: str
    ipv4: str
    isolated: bool = True
    routed_to: str | None = None
    ifindex: int | None = None

    def __post_init__(self) -> None:
        # Every field ends up in an nft or ip command line: refuse anything that is not what it claims to be.
        if not _PORT.match(self.port) or not _PORT.match(self.bridge):
            raise ValueError(f"bad interface name in {self!r}")
        if self.ifindex is None:
            object.__setattr__(self, "ifindex", _index_of(self.port))
        elif not isinstance(self.ifindex, int) or isinstance(self.ifindex, bool) or self.ifindex <= 0:
            raise ValueError(f"bad interface index in {self!r}")
        object.__setattr__(self, "mac", self.mac.lower())
        if not _MAC.match(self.mac):
            raise ValueError(f"bad MAC address in {self!r}")
        object.__setattr__(self, "ipv4", str(ipaddress.IPv4Address(self.ipv4)))
        if self.routed_to is not None:
            object.__setattr__(self, "routed_to", str(ipaddress.IPv4Address(self.routed_to)))


def _index_of(value: str) -> int | None:
    """The interface index an nft listing's ``iface_index`` value stands for: a number is a vanished interface's,
    a name is a present one's (read from sysfs; ``None`` if it vanished meanwhile)."""
    if value.isdigit():
        return int(value)
    if not _PORT.match(value):
        return None
    try:
        with open(f"/sys/class/net/{value}/ifindex") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_PATH)


def _run(argv: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env={"PATH": _PATH})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailableError(f"the spoofing guard could not run {argv[0]}: {exc}", field="network",
                                      rule="GYM-10") from exc
    if check and proc.returncode != 0:
        raise SandboxUnavailableError(
            f"the spoofing guard failed: {' '.join(argv)}: {proc.stderr.strip()[-500:]}", field="network",
            rule="GYM-10")
    return proc


def unavailable_reason() -> str | None:
    """``None`` when the guard is (or can be) installed here, else why not; installs it (`ensure`) to find out."""
    if os.geteuid() != 0:
        return "harbor_gym does not run as root, so it cannot install its spoofing guard (nftables)"
    for tool in ("nft", "ip", "bridge", "nsenter"):
        if _tool(tool) is None:
            return f"{tool} is not installed (run scripts/setup-host.sh), so the spoofing guard cannot be installed"
    try:
        ensure()
    except SandboxUnavailableError as exc:
        return str(exc)
    return None


def ensure() -> None:
    """Install the guard's table and rules (idempotent, atomic, once per process; prunes what dead runs left).

    Raises:
        SandboxUnavailableError: ``nft`` refused (e.g. a kernel without nftables' bridge family).
    """
    global _ensured
    with _lock:
        if _ensured:
            return
        _run([_tool("nft") or "nft", "-f", "-"], stdin=_SKELETON)
        _ensured = True
    try:
        _prune()
        _drop_legacy_table()
    except Exception as exc:  # pruning is housekeeping: what it misses is replaced at the next bind
        log.debug("spoofing guard: pruning failed: %s", exc)


def _drop_legacy_table() -> None:
    """Delete the name-keyed table of earlier versions once none of its bound ports exists (a process of an earlier
    version still running keeps its guard until then)."""
    nft = _tool("nft") or "nft"
    proc = _run([nft, "-j", "list", "table", "bridge", LEGACY_TABLE], check=False)
    if proc.returncode != 0:
        return
    ports = _elements(proc.stdout).get("ports", [])
    if any(isinstance(p, str) and os.path.exists(f"/sys/class/net/{p}") for p in ports):
        return
    _run([nft, "delete", "table", "bridge", LEGACY_TABLE], check=False)


def _elements(proc_out: str) -> dict[str, list[list[str] | str]]:
    """Set name -> its elements from ``nft -j list table`` output (concatenations as lists)."""
    sets: dict[str, list] = {}
    for item in json.loads(proc_out or "{}").get("nftables", []):
        spec = item.get("set")
        if spec is None:
            continue
        elems = []
        for elem in spec.get("elem") or []:
            if isinstance(elem, dict) and "concat" in elem:
                elems.append([str(v) for v in elem["concat"]])
            elif isinstance(elem, dict) and "elem" in elem:  # an element with attributes
                inner = elem["elem"].get("val", elem["elem"])
                elems.append([str(v) for v in inner["concat"]] if isinstance(inner, dict) else str(inner))
            else:
                elems.append(str(elem))
        sets[spec["name"]] = elems
    return sets


def _delete_script(sets: dict[str, list], doomed) -> str:
    """Delete lines for every element whose port index satisfies ``doomed(index)`` (an element whose port vanished
    between the listing and now has no index: it is left to the next prune)."""
    lines = []
    for name, elems in sets.items():
        for elem in elems:
            index = _index_of(elem[0] if isinstance(elem, list) else elem)
            if index is None or not doomed(index):
                continue
            key = " . ".join([str(index), *elem[1:]]) if isinstance(elem, list) else str(index)
            lines.append(f"delete element bridge {TABLE} {name} {{ {key} }}")
    return "\n".join(lines) + ("\n" if lines else "")


def _list_table() -> dict[str, list]:
    return _elements(_run([_tool("nft") or "nft", "-j", "list", "table", "bridge", TABLE]).stdout)


def _prune() -> None:
    """Delete elements of ports that no longer exist, and permanent neighbour entries on harbor_gym's bridges that
    no bound live port names (left by runs that were SIGKILLed)."""
    # neighbour entries first: `bind` adds its elements before its entry, so every entry read here whose binding
    # is live (another process's, made meanwhile) has its elements in the listing that follows
    out = _run([_tool("ip") or "ip", "-j", "-4", "neigh", "show", "nud", "permanent"], check=False).stdout
    sets = _list_table()
    present = _present_indexes()
    script = _delete_script(sets, lambda index: index not in present)
    if script:
        _run([_tool("nft") or "nft", "-f", "-"], stdin=script, check=False)
    live = {(e[1], e[2]) for e in sets.get("ip4_ok", []) if isinstance(e, list) and _index_of(e[0]) in present}
    for entry in json.loads(out or "[]"):
        dev, dst, mac = entry.get("dev", ""), entry.get("dst", ""), (entry.get("lladdr") or "").lower()
        if _OUR_BRIDGE.match(dev) and (mac, dst) not in live:
            _run([_tool("ip") or "ip", "neigh", "del", dst, "dev", dev], check=False)


def _present_indexes() -> set[int]:
    """The indexes of this namespace's interfaces now."""
    found = set()
    for name in os.listdir("/sys/class/net"):
        index = _index_of(name)
        if index is not None:
            found.add(index)
    return found


def _element_lines(b: Binding, verb: str) -> list[str]:
    """``verb`` (add/delete) lines of ``b``'s elements; ``ports`` last on add, first on delete."""
    i = b.ifindex
    lines = [
        f'{verb} element bridge {TABLE} arp_ok {{ {i} . {b.mac} . {b.mac} . {b.ipv4} }}',
        f'{verb} element bridge {TABLE} ip4_ok {{ {i} . {b.mac} . {b.ipv4} }}',
    ]
    if b.isolated:
        lines.append(f'{verb} element bridge {TABLE} isolated {{ {i} }}')
    if b.routed_to:
        lines.append(f'{verb} element bridge {TABLE} routed_ok {{ {i} . {b.routed_to} }}')
        lines.append(f'{verb} element bridge {TABLE} routed_ports {{ {i} }}')
    lines.append(f'{verb} element bridge {TABLE} ports {{ {i} }}')
    return lines if verb == "add" else lines[::-1]


def bind(binding: Binding) -> None:
    """Bind port ``binding.ifindex`` to its MAC and address (see the module docstring). Idempotent (a re-bind of
    the same port replaces its elements); replaces the neighbour entry a previous sandbox of that address left.

    Raises:
        SandboxUnavailableError: the port's index is unknown, or a host command failed (the caller stops the
            sandbox).
    """
    ensure()
    b = binding
    if b.ifindex is None:
        raise SandboxUnavailableError(f"the spoofing guard found no interface {b.port} to bind", field="network",
                                      rule="GYM-10")
    nft = _tool("nft") or "nft"
    stale = ""
    if _run([nft, "get", "element", "bridge", TABLE, "ports", f"{{ {b.ifindex} }}"], check=False).returncode == 0:
        stale = _delete_script(_list_table(), lambda index: index == b.ifindex)  # this port, bound before
    script = stale + "\n".join(_element_lines(b, "add")) + "\n"
    _run([nft, "-f", "-"], stdin=script)  # one transaction: the port is bound whole or not at all
    _run([_tool("ip") or "ip", "neigh", "replace", b.ipv4, "lladdr", b.mac, "dev", b.bridge, "nud", "permanent"])
    _run([_tool("bridge") or "bridge", "fdb", "replace", b.mac, "dev", b.port, "master", "static"])


def unbind(binding: Binding) -> None:
    """Remove ``binding``'s elements and its neighbour entry (if it still names its MAC); call it once the sandbox
    is gone. Never raises."""
    b = binding
    nft = _tool("nft") or "nft"
    try:
        lines = _element_lines(b, "delete")
        if _run([nft, "-f", "-"], stdin="\n".join(lines) + "\n", check=False).returncode != 0:
            for line in lines:  # some were pruned already: delete the rest one by one
                _run([nft, "-f", "-"], stdin=line + "\n", check=False)
        out = _run([_tool("ip") or "ip", "-j", "-4", "neigh", "show", b.ipv4, "dev", b.bridge], check=False).stdout
        for entry in json.loads(out or "[]"):
            if (entry.get("lladdr") or "").lower() == b.mac:
                _run([_tool("ip") or "ip", "neigh", "del", b.ipv4, "dev", b.bridge], check=False)
    except Exception as exc:  # leftovers are pruned and replaced later
        log.debug("spoofing guard: unbinding %s failed: %s", b.port, exc)


def netns_ports(netns: str) -> dict[str, int]:
    """MAC -> host ifindex of the peer, for every veth interface in the network namespace at path ``netns``.

    Runs the host's ``ip`` in that network namespace only (``nsenter --net``, never its mount namespace), so no file
    of the sandbox is used. The peer index is the kernel's (``iflink``), which a sandbox process cannot change.
    """
    proc = _run([_tool("nsenter") or "nsenter", f"--net={netns}", "--", _tool("ip") or "ip", "-j", "link", "show"])
    ports: dict[str, int] = {}
    for link in json.loads(proc.stdout or "[]"):
        mac, peer = (link.get("address") or "").lower(), link.get("link_index")
        if mac and peer and link.get("ifname") != "lo":
            ports[mac] = int(peer)
    return ports


def host_port(ifindex: int) -> tuple[str, str | None]:
    """The host interface of index ``ifindex``: ``(name, its bridge or None)``, read from this namespace's sysfs.

    Raises:
        SandboxUnavailableError: no such interface here.
    """
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/ifindex") as fh:
                if int(fh.read()) != ifindex:
                    continue
        except (OSError, ValueError):  # vanished meanwhile
            continue
        master = f"/sys/class/net/{name}/master"
        return name, os.path.basename(os.readlink(master)) if os.path.islink(master) else None
    raise SandboxUnavailableError(f"the spoofing guard found no host interface of index {ifindex} (the sandbox's "
                                  "veth peer)", field="network", rule="GYM-10")
