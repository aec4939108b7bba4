"""Podman's networks for sandboxes: the public network, compose groups' bridge names and the host rules that keep
them off the host and apart (SPEC GYM-10), beside Docker's (`harbor_gym.sandbox._netfilter`).

Podman's networks never share a name or a bridge interface with Docker's: a podman network using Docker's bridge
name once made podman's network stack delete Docker's bridge. So every bridge harbor_gym gives podman is named
``hgp-...`` (`IFACE_PREFIX`): the public network `PUBLIC_NETWORK` on `BRIDGE_IFACE`, each compose group's on
``hgp-g<random>`` (`group_bridge_name`).

Podman has no ``enable_icc=false``; inter-container traffic is cut by the host rules instead. With a rootful,
local podman (its bridges in this network namespace) and harbor_gym as root, `public_network` installs
idempotently, first in their chains (IPv4 unless noted; `filter_rules`):

- ``INPUT -i hgp-+ -j DROP`` (IPv4 and IPv6): nothing a sandbox sends to the host is accepted, except DNS
  (port 53) on compose groups' bridges (``hgp-g+``), where podman's aardvark-dns answers the services' names on
  the bridge's gateway (a group's network is internal: the gateway is the only host address it routes to). The
  public network has no DNS server of podman's (its sandboxes use the host's resolvers over their egress);
- in ``FORWARD``: destination-NATed traffic from ``hgp-+`` dropped (other containers' published ports); traffic
  from ``hgp-+`` passes only towards the interfaces of the host's default routes (chain `OUT_CHAIN`), so
  never into a sibling (bridged frames cross ``FORWARD`` as ``-i hgp-public0 -o hgp-public0``, which needs
  ``bridge-nf-call-iptables``), another podman network, Docker's bridges or any other interface; and nothing
  but replies enters ``hgp-+``; IPv6 forwarding from and to ``hgp-+`` is dropped.

Rootless podman's bridges live in the user's own network namespace, where no host rule reaches: there a public
sandbox gets its own ``slirp4netns`` stack instead of a shared bridge (no sibling shares its network), and public
tasks are refused unless ``unfiltered_network="allow"``, since slirp4netns routes to the host's own addresses.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any

from harbor_gym.errors import SandboxError
from harbor_gym.sandbox import _netfilter
from harbor_gym.sandbox._engine import translate_error
from harbor_gym.sandbox._netfilter import PublicNetwork
from harbor_gym.sandbox._podman import engine_of, libpod
from harbor_gym.sandbox.base import MANAGED_LABEL

if TYPE_CHECKING:
    import docker

__all__ = ["PUBLIC_NETWORK", "BRIDGE_IFACE", "IFACE_PREFIX", "GROUP_IFACE_PREFIX", "INPUT_CHAIN", "OUT_CHAIN", "IN_CHAIN", "ROOTLESS_MODE",
           "public_network", "group_bridge_name", "filter_rules", "forget"]

log = logging.getLogger("harbor_gym.sandbox")

#: Podman's shared network of public sandboxes (never Docker's name).
PUBLIC_NETWORK = "hgp-public"
#: Its bridge interface (never Docker's ``hg-public0``).
BRIDGE_IFACE = "hgp-public0"
#: Prefix of every bridge harbor_gym gives podman (the host rules match ``hgp-+``).
IFACE_PREFIX = "hgp-"
#: Prefix of compose groups' bridges on podman.
GROUP_IFACE_PREFIX = "hgp-g"
#: The INPUT chain of ``hgp-+``: DNS on group bridges, nothing else.
INPUT_CHAIN = "HGP-INPUT"
#: The FORWARD chain letting traffic from ``hgp-+`` out through the default routes' interfaces only.
OUT_CHAIN = "HGP-OUT"
#: The FORWARD chain letting only replies into ``hgp-+``.
IN_CHAIN = "HGP-IN"
#: The network mode of a public sandbox on rootless podman: a network stack of its own.
ROOTLESS_MODE = "slirp4netns"

_lock = threading.Lock()
_known: dict[str, PublicNetwork] = {}


def group_bridge_name(client: Any) -> str:
    """A fresh bridge interface name for a compose group's network on ``client``'s engine (≤ 15 characters):
    ``hgp-g`` + 10 hex digits on podman, Docker's `_netfilter.group_bridge_name` otherwise."""
    if engine_of(client) is None:
        return _netfilter.group_bridge_name()
    return GROUP_IFACE_PREFIX + secrets.token_hex(5)


def filter_rules(uplinks: list[str]) -> list[tuple[str, str, list[str]]]:
    """The host rules for podman's bridges, pure: ``(binary, chain, rule)``. Where order matters the rules sit in
    chains of ours (`INPUT_CHAIN`, `OUT_CHAIN`, `IN_CHAIN`) that end with a DROP, everything else in them being an
    exit before it, so an idempotent re-install (inserting what is missing first) never reorders a decision; the
    host chains only get jumps and drops, first in them. ``uplinks``: the
    interfaces of the default routes. Within a compose group traffic is accepted only as bridged frames (one
    group's bridge to itself: ``--physdev-is-bridged``), so two groups never reach each other; a FORWARD policy
    of DROP (Docker's) would otherwise drop it, podman adding no rule for an internal network."""
    hgp, groups = IFACE_PREFIX + "+", GROUP_IFACE_PREFIX + "+"
    return [
        ("iptables", "INPUT", ["-i", hgp, "-j", INPUT_CHAIN]),
        ("iptables", INPUT_CHAIN, ["-i", groups, "-p", "udp", "--dport", "53", "-j", "ACCEPT"]),
        ("iptables", INPUT_CHAIN, ["-i", groups, "-p", "tcp", "--dport", "53", "-j", "ACCEPT"]),
        ("iptables", INPUT_CHAIN, ["-j", "DROP"]),
        ("ip6tables", "INPUT", ["-i", hgp, "-j", "DROP"]),
        ("ip6tables", "FORWARD", ["-i", hgp, "-j", "DROP"]),
        ("ip6tables", "FORWARD", ["-o", hgp, "-j", "DROP"]),
        ("iptables", "FORWARD", ["-i", hgp, "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"]),
        ("iptables", "FORWARD", ["-i", hgp, "-j", OUT_CHAIN]),
        ("iptables", "FORWARD", ["-o", hgp, "-j", IN_CHAIN]),
        ("iptables", OUT_CHAIN, ["-i", groups, "-m", "physdev", "--physdev-is-bridged", "-j", "ACCEPT"]),
        *[("iptables", OUT_CHAIN, ["-o", dev, "-j", "RETURN"]) for dev in uplinks],
        ("iptables", OUT_CHAIN, ["-j", "DROP"]),
        ("iptables", IN_CHAIN, ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"]),
        ("iptables", IN_CHAIN, ["-j", "DROP"]),
    ]


def forget(client: Any) -> None:
    """Drop what is known of ``client``'s public network (it was removed)."""
    with _lock:
        _known.pop(_key(client), None)


def public_network(client: "docker.DockerClient") -> PublicNetwork:
    """The engine's public network for sandboxes: Docker's (`_netfilter.public_network`) on a Docker engine; on
    podman `PUBLIC_NETWORK`, created if missing, with the host rules where they can be installed — rootless podman
    gets `ROOTLESS_MODE` (its ``name``), never filtered. Known once per engine and process.

    Raises:
        SandboxError: a podman network of that name exists that is not harbor_gym's (another bridge name, DNS on).
        SandboxUnavailableError: the engine does not answer (retryable).
    """
    engine = engine_of(client)
    if engine is None:
        return _netfilter.public_network(client)
    key = _key(client)
    with _lock:
        known = _known.get(key)
        if known is None:
            if engine.rootless:
                known = PublicNetwork(ROOTLESS_MODE, None, "rootless podman's networks live in the user's own "
                                      "network namespace (slirp4netns), out of reach of the host's firewall")
            else:
                gateway = _ensure(client)
                known = PublicNetwork(PUBLIC_NETWORK, gateway, _install_filter(engine, gateway))
            _known[key] = known
            fresh = True
        else:
            fresh = False
    if fresh and not known.filtered:
        log.warning("podman's public-network sandboxes are not filtered from the host (%s): they reach %s",
                    known.unfiltered_reason, _netfilter.REACHABLE_WITHOUT_FILTER)
    return known


def _key(client: Any) -> str:
    engine = engine_of(client)
    return engine.url if engine is not None else str(id(client))


def _ensure(client: Any) -> str | None:
    """Create (or inspect) the public network through the libpod API (the compat API cannot turn DNS off);
    returns its gateway."""
    import docker.errors

    try:
        try:
            attrs = libpod(client, "GET", f"/networks/{PUBLIC_NETWORK}/json")
        except docker.errors.NotFound:
            body = {"name": PUBLIC_NETWORK, "driver": "bridge", "network_interface": BRIDGE_IFACE,
                    "internal": False, "dns_enabled": False, "options": {"isolate": "true"},
                    "labels": {MANAGED_LABEL: "true", _netfilter.SHARED_LABEL: "public"}}
            try:
                libpod(client, "POST", "/networks/create", json=body)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another process created it meanwhile
                    raise
            attrs = libpod(client, "GET", f"/networks/{PUBLIC_NETWORK}/json")
    except Exception as exc:
        translate_error(exc, what=f"create podman's network {PUBLIC_NETWORK}")
    if attrs.get("network_interface") != BRIDGE_IFACE or attrs.get("dns_enabled") or attrs.get("internal"):
        raise SandboxError(f"a podman network named {PUBLIC_NETWORK} exists with another bridge than {BRIDGE_IFACE} "
                           "or with DNS on; it is not harbor_gym's: remove it", field="network", rule="GYM-10")
    return next((s.get("gateway") for s in attrs.get("subnets") or [] if s.get("gateway")), None)


def _install_filter(engine: Any, gateway: str | None) -> str | None:
    """Install `filter_rules` for a rootful podman; ``None`` on success, else why it cannot be done. The rules
    match bridge names, so they hold before netavark makes the bridge (with the network's first container)."""
    if engine.socket_path is None:
        return f"podman at {engine.url} is remote: its bridges are not in this host's network namespace"
    if os.geteuid() != 0:
        return "harbor_gym does not run as root, so it cannot install its host firewall rules"
    if gateway is not None and _netfilter._ipv4_of(BRIDGE_IFACE) not in (None, gateway.split("/")[0]):
        return f"the interface {BRIDGE_IFACE} here is not podman's bridge (its address is not {gateway})"
    return _install_rules()


def _install_rules() -> str | None:
    from harbor_gym.sandbox.local._net import _uplinks

    run = _netfilter._run
    wait = ["-w", "10"]
    try:
        with open("/proc/sys/net/bridge/bridge-nf-call-iptables", encoding="ascii") as f:
            bridged = f.read().strip() == "1"
    except OSError:
        bridged = False
    if not bridged:
        return ("the kernel does not pass bridged traffic through iptables (net.bridge.bridge-nf-call-iptables "
                "is not 1; Docker's engine turns it on), so sandboxes on one podman bridge would reach each other")
    uplinks = _uplinks()
    if not uplinks:
        return "the host has no default route, so podman's sandboxes have no egress interface to be limited to"
    have_v6 = os.path.exists("/proc/sys/net/ipv6")
    rules = filter_rules(uplinks)
    own = (INPUT_CHAIN, OUT_CHAIN, IN_CHAIN)
    for chain in own:
        if run(["iptables", *wait, "-n", "-L", chain]) is not None:
            failed = run(["iptables", *wait, "-N", chain])
            if failed is not None and "exists" not in failed:
                return f"iptables -N {chain} failed: {failed}"
    # our chains: the final DROP appended once, every other rule inserted first (never a window without the DROP);
    # then the jumps and drops first in the host's chains
    ordered = [r for r in rules if r[1] in own and r[2] == ["-j", "DROP"]] + \
        list(reversed([r for r in rules if r[1] in own and r[2] != ["-j", "DROP"]])) + \
        list(reversed([r for r in rules if r[1] not in own]))
    for binary, chain, rule in ordered:
        if binary == "ip6tables" and not have_v6:
            continue
        if run([binary, *wait, "-C", chain, *rule]) is None:
            continue
        where = ["-A", chain] if chain in own and rule == ["-j", "DROP"] else ["-I", chain, "1"]
        failed = run([binary, *wait, *where, *rule])
        if failed is not None:
            return f"{binary} {' '.join(where)} {' '.join(rule)} failed: {failed}"
    log.info("host filter for podman's bridges (%s+) installed: INPUT drop, egress only through %s",
             IFACE_PREFIX, ", ".join(uplinks))
    return None
