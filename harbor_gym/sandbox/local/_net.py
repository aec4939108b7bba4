"""Egress of public-network local sandboxes: one host bridge, one veth per sandbox, and a host firewall through
which a sandbox reaches no host address and no sibling (SPEC GYM-10; issue 12 item 7, local part).

Every local sandbox has its own network namespace (`LocalSandbox` starts its keeper with ``unshare --net``); with the
network off it holds only ``lo``. With the network on, `attach` adds:

- a veth pair: its host end is a port of the bridge `BRIDGE` (``hg-local0``, created once by `ensure_bridge`) with
  *port isolation* on, so no frame passes between two sandboxes' ports; its sandbox end becomes ``eth0`` with one
  address of `subnet()` (default ``10.213.0.0/16``, ``$HARBOR_GYM_LOCAL_SUBNET``) and a default route through the
  bridge's address. IPv6 is off on both ends and on the bridge (no link-local path to the host);
- host firewall rules, installed idempotently: everything entering the host from the bridge is dropped (``INPUT -i
  hg-local0 -j DROP``, IPv4 and IPv6: not the bridge's address, not 127.0.0.1, not any host IP, not Docker's
  gateways); forwarded traffic from the bridge passes only towards the interfaces that carry a default route
  (masqueraded there) and is dropped towards anything else (the bridge itself, Docker's bridges and published
  ports, other interfaces); traffic towards the bridge only as replies (conntrack). The drops sit in the mangle
  table (which Docker never reorders; it runs before the filter table) and again in the filter table, whose
  ``HG-LOCAL-OUT``/``HG-LOCAL-BACK`` chains also hold the ACCEPTs egress needs under a FORWARD policy of DROP.

The spoofing guard (`harbor_gym.sandbox._spoofguard`) binds each sandbox's port to its MAC and address before the
port comes up, so no sandbox sends as another (forged ARP or IPv4 source), and the host's neighbour entry of its
address is permanent. A sandbox without a network that may reach one host service (``routed_only``,
`harbor_gym.sandbox.host_route`) gets ``eth0`` too, with no default route, and the guard lets it send IPv4 only to
the bridge's address, where the host admits only the route's port (the chain ``HG-HOST-ROUTE``, jumped to first in
``INPUT`` of both tables).

Every host command here runs host binaries (``ip``, ``bridge``, ``iptables``) in the host's mount namespace; the
ones that configure ``eth0`` join only the sandbox's network namespace (``nsenter --net``), never its mount
namespace, so no file of the sandbox is used. Addresses are leased as files under `LEASE_DIR` (created exclusively,
naming the sandbox's folder; a lease whose folder is gone is stale and reused). The veth pair vanishes with the
sandbox's network namespace.

Where the filter cannot be installed (not root, no ``ip``/``iptables``/``nft``, an address clash), `filter_unavailable_reason`
says why; `LocalSandbox` then refuses a public-network spec unless told that unfiltered egress is acceptable.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import _route_chain, _spoofguard

__all__ = ["BRIDGE", "LEASE_DIR", "subnet", "gateway", "filter_unavailable_reason", "ensure_bridge", "attach",
           "release"]

BRIDGE = "hg-local0"
#: Where address leases live (one file per address in use).
LEASE_DIR = Path("/run/harbor-gym-local-net")
_CHAIN_OUT = "HG-LOCAL-OUT"  # FORWARD, from a sandbox
_CHAIN_BACK = "HG-LOCAL-BACK"  # FORWARD, towards a sandbox
_DEFAULT_SUBNET = "10.213.0.0/16"
_TIMEOUT_S = 20.0
_ensured = False
_bindings: dict[str, _spoofguard.Binding] = {}  # address -> its port's binding


def subnet() -> ipaddress.IPv4Network:
    """The sandboxes' subnet (``$HARBOR_GYM_LOCAL_SUBNET``, else 10.213.0.0/16)."""
    return ipaddress.IPv4Network(os.environ.get("HARBOR_GYM_LOCAL_SUBNET") or _DEFAULT_SUBNET)


def gateway() -> ipaddress.IPv4Address:
    """The bridge's own address (the sandboxes' gateway; a host service routed to them listens there)."""
    return next(subnet().hosts())


_gateway = gateway


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=_TIMEOUT_S, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if check and proc.returncode != 0:
        raise SandboxUnavailableError(
            f"the local backend's network filter failed: {' '.join(argv)}: "
            f"{proc.stderr.decode(errors='replace').strip()[-500:]}", field="network")
    return proc


def _tool(name: str) -> str | None:
    return shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _routes() -> list[dict]:
    out = _run([_tool("ip") or "ip", "-j", "-4", "route", "show", "table", "all"], check=False)
    try:
        return json.loads(out.stdout or b"[]")
    except ValueError:
        return []


def filter_unavailable_reason() -> str | None:
    """None when `ensure_bridge` can install the filter here, else why not (for the refusal's message)."""
    if os.geteuid() != 0:
        return "installing the host firewall for the sandboxes' bridge needs root"
    for tool in ("ip", "bridge", "iptables", "ip6tables", "nsenter", "nft"):
        if _tool(tool) is None:
            return f"{tool} is not installed (run scripts/setup-host.sh)"
    net = subnet()
    for route in _routes():
        dst = route.get("dst")
        if not dst or dst == "default" or route.get("dev") == BRIDGE:
            continue
        try:
            other = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if other.version == 4 and other.overlaps(net) and other.prefixlen > 0:
            return f"the sandboxes' subnet {net} overlaps the host route {dst} (set HARBOR_GYM_LOCAL_SUBNET)"
    return _spoofguard.unavailable_reason()


def _uplinks() -> list[str]:
    """The interfaces carrying a default route (egress goes there and nowhere else)."""
    devs = []
    for route in _routes():
        if route.get("dst") == "default" and route.get("dev") and route["dev"] != BRIDGE:
            if route["dev"] not in devs:
                devs.append(route["dev"])
    return devs


def _ensure_rule(tool: str, table: str, chain: str, rule: list[str]) -> None:
    """Insert ``rule`` at the top of ``chain`` unless it is there."""
    if _run([tool, "-w", "-t", table, "-C", chain, *rule], check=False).returncode != 0:
        _run([tool, "-w", "-t", table, "-I", chain, "1", *rule])


def _fill_chain(tool: str, table: str, chain: str, rules: list[list[str]]) -> None:
    if _run([tool, "-w", "-t", table, "-n", "-L", chain], check=False).returncode != 0:
        _run([tool, "-w", "-t", table, "-N", chain])
    _run([tool, "-w", "-t", table, "-F", chain])
    for rule in rules:
        _run([tool, "-w", "-t", table, "-A", chain, *rule])


def ensure_bridge() -> None:
    """Create the bridge and install the firewall (idempotent; serialised across processes by a lock file).

    Raises:
        SandboxUnavailableError: `filter_unavailable_reason`, or a host command failed.
    """
    global _ensured
    reason = filter_unavailable_reason()
    if reason:
        raise SandboxUnavailableError(f"the local backend cannot isolate a public network here: {reason}",
                                      field="network", rule="GYM-10")
    LEASE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    ip, iptables, ip6tables = _tool("ip"), _tool("iptables"), _tool("ip6tables")
    with open(LEASE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _run([ip, "link", "show", BRIDGE], check=False).returncode != 0:
            _run([ip, "link", "add", BRIDGE, "type", "bridge"])
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{BRIDGE}/disable_ipv6", "1")
        gw = f"{_gateway()}/{subnet().prefixlen}"
        _run([ip, "addr", "replace", gw, "dev", BRIDGE])
        _run([ip, "link", "set", BRIDGE, "up"])
        uplinks = _uplinks()
        # The guard, in the mangle table: it sees every packet before the filter table, where Docker (re)orders
        # FORWARD at will (its ACCEPTs for its own bridges and published ports could otherwise come first). Only
        # egress to an uplink and replies from one pass it; everything else from or to the bridge is dropped.
        _fill_chain(iptables, "mangle", _CHAIN_OUT, [["-o", dev, "-j", "RETURN"] for dev in uplinks] + [["-j", "DROP"]])
        _fill_chain(iptables, "mangle", _CHAIN_BACK, [
            ["-i", dev, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"] for dev in uplinks
        ] + [["-j", "DROP"]])
        _ensure_rule(iptables, "mangle", "FORWARD", ["-o", BRIDGE, "-j", _CHAIN_BACK])
        _ensure_rule(iptables, "mangle", "FORWARD", ["-i", BRIDGE, "-j", _CHAIN_OUT])
        _ensure_rule(iptables, "mangle", "INPUT", ["-i", BRIDGE, "-j", "DROP"])
        # The filter table: the same drop for the host, and the ACCEPTs egress needs where FORWARD's policy is DROP.
        _fill_chain(iptables, "filter", _CHAIN_OUT, [["-o", dev, "-j", "ACCEPT"] for dev in uplinks] + [["-j", "DROP"]])
        _fill_chain(iptables, "filter", _CHAIN_BACK, [
            ["-i", dev, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"] for dev in uplinks
        ] + [["-j", "DROP"]])
        _ensure_rule(iptables, "filter", "FORWARD", ["-o", BRIDGE, "-j", _CHAIN_BACK])
        _ensure_rule(iptables, "filter", "FORWARD", ["-i", BRIDGE, "-j", _CHAIN_OUT])
        _ensure_rule(iptables, "filter", "INPUT", ["-i", BRIDGE, "-j", "DROP"])
        for dev in uplinks:
            _ensure_rule(iptables, "nat", "POSTROUTING", ["-s", str(subnet()), "-o", dev, "-j", "MASQUERADE"])
        for table in ("mangle", "filter"):
            for chain in ("INPUT", "FORWARD"):
                _ensure_rule(ip6tables, table, chain, ["-i", BRIDGE, "-j", "DROP"])
            _ensure_rule(ip6tables, table, "FORWARD", ["-o", BRIDGE, "-j", "DROP"])
        for table in ("mangle", "filter"):  # host routes' exceptions stay above the INPUT drops
            failed = _route_chain.ensure_first(iptables, table)
            if failed is not None:
                raise SandboxUnavailableError(f"the local backend's host route chain failed: {failed}",
                                              field="network", rule="GYM-10")
    _ensured = True


def _write_sysctl(path: str, value: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except FileNotFoundError:  # IPv6 disabled on this host: nothing to turn off
        pass


def _lease_address(owner: Path) -> ipaddress.IPv4Address:
    """An address of the subnet no live sandbox holds, leased to ``owner`` (a sandbox folder)."""
    net = subnet()
    first, size = int(net.network_address), net.num_addresses
    for _ in range(256):
        addr = ipaddress.IPv4Address(first + 2 + secrets.randbelow(size - 3))
        path = LEASE_DIR / str(addr)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                holder = Path(path.read_text())
            except OSError:
                continue
            if not holder.exists():  # its sandbox is gone: a stale lease
                path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(owner))
        return addr
    raise SandboxUnavailableError(f"no free address left in {net} for a local sandbox", field="network")


def attach(pid: int, owner: Path, *, routed_only: bool = False) -> ipaddress.IPv4Address:
    """Give the network namespace of ``pid`` an ``eth0`` on the bridge (see the module docstring), its port bound
    by the spoofing guard before it comes up.

    Args:
        pid: a process of the sandbox (its network namespace gets ``eth0``).
        owner: the sandbox's folder (the address lease names it).
        routed_only: no default route, and IPv4 to the bridge's address only (a sandbox without a network that
            may reach one host service).

    Returns:
        the sandbox's address (leased to ``owner`` until `release`).

    Raises:
        SandboxUnavailableError: the filter is unavailable or a host command failed (the lease is released).
    """
    if not _ensured or _run([_tool("ip") or "ip", "link", "show", BRIDGE], check=False).returncode != 0:
        ensure_bridge()
    ip, bridge, nsenter = _tool("ip"), _tool("bridge"), _tool("nsenter")
    addr = _lease_address(owner)
    tag = secrets.token_hex(5)
    host_end, inner = f"hgv{tag}", f"hgp{tag}"
    netns = [nsenter, f"--net=/proc/{pid}/ns/net", "--"]  # the network namespace only, never the mount one
    try:
        _run([ip, "link", "add", host_end, "type", "veth", "peer", "name", inner])
        try:
            mac = Path(f"/sys/class/net/{inner}/address").read_text().strip()
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{host_end}/disable_ipv6", "1")
            _run([ip, "link", "set", inner, "netns", str(pid)])
            _run([ip, "link", "set", host_end, "master", BRIDGE])
            _run([bridge, "link", "set", "dev", host_end, "isolated", "on"])
            binding = _spoofguard.Binding(port=host_end, bridge=BRIDGE, mac=mac, ipv4=str(addr),
                                          routed_to=str(_gateway()) if routed_only else None)
            _spoofguard.bind(binding)  # GYM-10: before the port comes up
            _bindings[str(addr)] = binding
            _run([ip, "link", "set", host_end, "up"])
        except BaseException:
            _run([ip, "link", "del", host_end], check=False)
            raise
        prefix = subnet().prefixlen
        _run([*netns, ip, "link", "set", inner, "name", "eth0"])
        _run([*netns, "/bin/sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 2>/dev/null; :"])
        _run([*netns, ip, "addr", "add", f"{addr}/{prefix}", "dev", "eth0"])
        _run([*netns, ip, "link", "set", "eth0", "up"])
        if not routed_only:
            _run([*netns, ip, "route", "add", "default", "via", str(_gateway())])
    except BaseException:
        release(addr)
        raise
    return addr


def release(addr: ipaddress.IPv4Address | str | None) -> None:
    """Give the address back (idempotent, never raises)."""
    if addr is None:
        return
    binding = _bindings.pop(str(addr), None)
    if binding is not None:
        _spoofguard.unbind(binding)
    try:
        (LEASE_DIR / str(addr)).unlink()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            pass
