"""The one network every public-network Docker sandbox joins, and the host firewall that keeps it off the host
(SPEC GYM-10: sandboxes cannot reach each other or any host service).

``harbor-gym-public`` is a bridge network harbor_gym creates once per engine, with inter-container traffic off
(``enable_icc=false``: two sandboxes on it cannot reach each other) and a fixed bridge interface name
(``hg-public0``), so that host rules keyed by that name stay valid when ``harbor-gym gc`` removes the network
while unused and a later sandbox creates it again. It carries the managed label and `SHARED_LABEL`, never a run's
labels: it is shared by every run of the engine.

On a local engine (the bridge interface is in this process's network namespace) run as root, harbor_gym installs,
idempotently, with the host's ``iptables``/``ip6tables`` (the host firewall, not the Docker CLI):

- ``INPUT -i hg-public0 -j DROP`` (IPv4 and IPv6), first in the chain: nothing a sandbox sends to the host itself
  (the bridge gateway, any host IP, services bound on 0.0.0.0) is accepted; the same for every compose group's
  bridge (``hgg-<random>``, `group_bridge_name`): Docker gives even an ``internal`` network a gateway address on
  the host, through which the host's services would otherwise answer;
- in ``DOCKER-USER`` (else ``FORWARD``): drops of traffic from the bridge back into it, into ``docker0`` and
  ``br-*`` bridges (other Docker networks' containers) and of anything destination-NATed (another container's
  published port reached through a host address); IPv6 forwarding from the bridge is dropped too.

The sandbox's own loopback is its own; egress to other machines is what "public" means. Where the rules cannot be
installed (a remote or rootless engine, not root, no iptables) `public_network` says why; the engine still keeps
sandboxes apart (icc off), but host services on the gateway and host addresses stay reachable. The episode refuses
public-network tasks there unless ``EnvConfig.unfiltered_network = "allow"``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harbor_gym.errors import SandboxError
from harbor_gym.sandbox._engine import engine_info, translate_error
from harbor_gym.sandbox.base import MANAGED_LABEL

if TYPE_CHECKING:
    import docker

__all__ = ["PUBLIC_NETWORK", "BRIDGE_IFACE", "GROUP_IFACE_PREFIX", "SHARED_LABEL", "PublicNetwork",
           "public_network", "forget", "filter_rules", "group_bridge_name", "REACHABLE_WITHOUT_FILTER"]

log = logging.getLogger("harbor_gym.sandbox")

#: The shared network of public-network sandboxes.
PUBLIC_NETWORK = "harbor-gym-public"
#: Its bridge interface on the engine's host (≤ 15 characters).
BRIDGE_IFACE = "hg-public0"
#: Prefix of every compose group's bridge interface (the host rules match ``hgg-+``).
GROUP_IFACE_PREFIX = "hgg-"
#: Marks a resource shared by every run (``harbor-gym gc`` removes it only while unused).
SHARED_LABEL = "io.harbor-gym.shared"
#: What a public-network sandbox still reaches when the host filter is not installed (for messages and logs).
REACHABLE_WITHOUT_FILTER = ("every service the engine's host listens on through the bridge gateway and the host's "
                            "own addresses (0.0.0.0 listeners), and containers' published ports; sibling "
                            "sandboxes stay apart (inter-container traffic is off)")

_OPTIONS = {"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": BRIDGE_IFACE}
_IPTABLES_WAIT = ["-w", "10"]
_lock = threading.Lock()
_known: dict[str, "PublicNetwork"] = {}


@dataclass(frozen=True)
class PublicNetwork:
    """The shared public network of an engine.

    Attributes:
        name: the Docker network's name (`PUBLIC_NETWORK`).
        gateway: its IPv4 gateway (the host side of the bridge), if known.
        unfiltered_reason: ``None`` when the host filter is installed; else why it is not.
    """

    name: str
    gateway: str | None
    unfiltered_reason: str | None

    @property
    def filtered(self) -> bool:
        """True iff the host filter is installed (no host service and no other network is reachable)."""
        return self.unfiltered_reason is None


def group_bridge_name() -> str:
    """A fresh bridge interface name for a compose group's network (``hgg-`` + 10 hex digits, ≤ 15 characters)."""
    import secrets

    return GROUP_IFACE_PREFIX + secrets.token_hex(5)


def filter_rules(iface: str = BRIDGE_IFACE, *, forward_chain: str = "DOCKER-USER") -> list[tuple[str, str, list[str]]]:
    """The host rules of the filter, pure: ``(binary, chain, rule)`` in insertion order (each goes first)."""
    groups = GROUP_IFACE_PREFIX + "+"
    return [
        ("iptables", "INPUT", ["-i", groups, "-j", "DROP"]),
        ("ip6tables", "INPUT", ["-i", groups, "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", groups, "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"]),
        ("iptables", "INPUT", ["-i", iface, "-j", "DROP"]),
        ("ip6tables", "INPUT", ["-i", iface, "-j", "DROP"]),
        ("ip6tables", "FORWARD", ["-i", iface, "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", iface, "-o", iface, "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", iface, "-o", "docker0", "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", iface, "-o", "br-+", "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", iface, "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"]),
    ]


def forget(client: "docker.DockerClient") -> None:
    """Drop what is known of ``client``'s engine's network (it was removed, e.g. by ``harbor-gym gc``)."""
    with _lock:
        _known.pop(_engine_key(client), None)


def public_network(client: "docker.DockerClient") -> PublicNetwork:
    """The engine's shared public network, created if missing, with the host filter installed where possible.

    Known once per engine and process (`forget` drops it). Thread-safe; concurrent processes creating it race
    harmlessly (the loser inspects the winner's).

    Raises:
        SandboxError: a network of that name exists without inter-container traffic off (not harbor_gym's).
        SandboxUnavailableError: the engine does not answer (retryable).
    """
    key = _engine_key(client)
    with _lock:
        known = _known.get(key)
        if known is not None:
            return known
        net = _ensure(client)
        _known[key] = net
    if not net.filtered:
        log.warning("public-network sandboxes are not filtered from the host (%s): they reach %s",
                    net.unfiltered_reason, REACHABLE_WITHOUT_FILTER)
    return net


def _engine_key(client: "docker.DockerClient") -> str:
    try:
        return str(engine_info(client).get("ID") or id(client))
    except Exception:  # the engine does not answer: key by client, the next call fails as it should
        return str(id(client))


def _ensure(client: "docker.DockerClient") -> PublicNetwork:
    import docker.errors

    api = client.api
    try:
        try:
            attrs = api.inspect_network(PUBLIC_NETWORK)
        except docker.errors.NotFound:
            try:
                api.create_network(PUBLIC_NETWORK, driver="bridge", options=dict(_OPTIONS), check_duplicate=True,
                                   labels={MANAGED_LABEL: "true", SHARED_LABEL: "public"})
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another process created it meanwhile
                    raise
            attrs = api.inspect_network(PUBLIC_NETWORK)
    except docker.errors.APIError as exc:
        translate_error(exc, what=f"create the network {PUBLIC_NETWORK}")
    except Exception as exc:
        translate_error(exc, what=f"create the network {PUBLIC_NETWORK}")
    options = attrs.get("Options") or {}
    if options.get("com.docker.network.bridge.enable_icc") != "false" or attrs.get("Internal"):
        raise SandboxError(f"a Docker network named {PUBLIC_NETWORK} exists without inter-container traffic off; "
                           "it is not harbor_gym's: remove it", field="network", rule="GYM-10")
    gateway = next((c.get("Gateway") for c in (attrs.get("IPAM") or {}).get("Config") or [] if c.get("Gateway")),
                   None)
    iface = options.get("com.docker.network.bridge.name") or BRIDGE_IFACE
    return PublicNetwork(PUBLIC_NETWORK, gateway, _install_filter(iface, gateway))


def _install_filter(iface: str, gateway: str | None) -> str | None:
    """Install the rules of `filter_rules` for ``iface``; ``None`` on success, else why it cannot be done."""
    if os.geteuid() != 0:
        return "harbor_gym does not run as root, so it cannot install its host firewall rules"
    if shutil.which("iptables") is None:
        return "the host has no iptables"
    if not os.path.exists(f"/sys/class/net/{iface}"):
        return (f"the engine's bridge {iface} is not in this host's network namespace (a remote or rootless "
                "engine)")
    if gateway is not None and _ipv4_of(iface) not in (None, gateway.split("/")[0]):
        return f"the interface {iface} here is not the engine's bridge (its address is not {gateway})"
    forward = "DOCKER-USER" if _run(["iptables", *_IPTABLES_WAIT, "-L", "DOCKER-USER", "-n"]) is None else "FORWARD"
    have_v6 = shutil.which("ip6tables") is not None and os.path.exists("/proc/sys/net/ipv6")
    for binary, chain, rule in reversed(filter_rules(iface, forward_chain=forward)):
        if binary == "ip6tables" and not have_v6:
            continue
        if _run([binary, *_IPTABLES_WAIT, "-C", chain, *rule]) is None:
            continue
        failed = _run([binary, *_IPTABLES_WAIT, "-I", chain, "1", *rule])
        if failed is not None:
            return f"{binary} -I {chain} {' '.join(rule)} failed: {failed}"
    log.info("host filter for %s installed (INPUT drop, forward isolation)", iface)
    return None


def _run(argv: list[str]) -> str | None:
    """Run a host firewall command; ``None`` on exit 0, else its complaint."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")[:300]


def _ipv4_of(iface: str) -> str | None:
    """The IPv4 address of ``iface`` in this network namespace, or ``None`` (no address yet)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        sock.close()
