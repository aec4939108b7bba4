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
  published port reached through a host address); IPv6 forwarding from the bridge is dropped too;
- the same INPUT drops for ``hg-proxy0``, the bridge of ``harbor-gym-proxy`` (`proxy_network`): the internal,
  icc-off network that sandboxes without a network join when they may reach one host service
  (`harbor_gym.sandbox.host_route`), and the drop of everything forwarded from or to it;
- ``INPUT -j HG-HOST-ROUTE`` above them all (`harbor_gym.sandbox._route_chain`): the only exceptions, one TCP port
  on one bridge's own address per open host route; empty while none is open;
- the spoofing guard (`harbor_gym.sandbox._spoofguard`): every sandbox port on these bridges (and on compose groups'
  ``hgg-*`` bridges) is bound to its own MAC and IPv4 address at start (`bind_container`), and the host's
  neighbour entries of sandbox addresses are permanent.

The sandbox's own loopback is its own; egress to other machines is what "public" means. Where the rules cannot be
installed (a remote or rootless engine, not root, no iptables, no nft for the spoofing guard) `public_network`
says why; the engine still keeps
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

from harbor_gym.errors import SandboxError, SandboxUnavailableError
from harbor_gym.sandbox import _route_chain, _spoofguard
from harbor_gym.sandbox._engine import engine_identity, engine_info, engine_key, is_remote, translate_error
from harbor_gym.sandbox.base import MANAGED_LABEL

if TYPE_CHECKING:
    import docker

__all__ = ["PUBLIC_NETWORK", "BRIDGE_IFACE", "GROUP_IFACE_PREFIX", "SHARED_LABEL", "PublicNetwork",
           "public_network", "forget", "filter_rules", "group_bridge_name", "REACHABLE_WITHOUT_FILTER",
           "PROXY_NETWORK", "PROXY_IFACE", "proxy_network", "bind_container", "unbind_all"]

log = logging.getLogger("harbor_gym.sandbox")

#: The shared network of public-network sandboxes.
PUBLIC_NETWORK = "harbor-gym-public"
#: Its bridge interface on the engine's host (≤ 15 characters).
BRIDGE_IFACE = "hg-public0"
#: The shared internal network of sandboxes without a network that may reach one host service (host_route).
PROXY_NETWORK = "harbor-gym-proxy"
#: Its bridge interface.
PROXY_IFACE = "hg-proxy0"
#: Prefix of every compose group's bridge interface (the host rules match ``hgg-+``).
GROUP_IFACE_PREFIX = "hgg-"
#: Marks a resource shared by every run (``harbor-gym gc`` removes it only while unused).
SHARED_LABEL = "io.harbor-gym.shared"
#: What a public-network sandbox still reaches when the host filter is not installed (for messages and logs).
REACHABLE_WITHOUT_FILTER = ("every service the engine's host listens on through the bridge gateway and the host's "
                            "own addresses (0.0.0.0 listeners), and containers' published ports; sibling "
                            "sandboxes stay apart (inter-container traffic is off)")

_OPTIONS = {"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": BRIDGE_IFACE}
_PROXY_OPTIONS = {"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": PROXY_IFACE}
_IPTABLES_WAIT = ["-w", "10"]
_lock = threading.Lock()
_known: dict[tuple[str, str], "PublicNetwork"] = {}


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
        ("iptables", "INPUT", ["-i", PROXY_IFACE, "-j", "DROP"]),
        ("ip6tables", "INPUT", ["-i", PROXY_IFACE, "-j", "DROP"]),
        ("ip6tables", "FORWARD", ["-i", PROXY_IFACE, "-j", "DROP"]),
        ("iptables", forward_chain, ["-i", PROXY_IFACE, "-j", "DROP"]),
        ("iptables", forward_chain, ["-o", PROXY_IFACE, "-j", "DROP"]),
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
        key = _engine_key(client)
        _known.pop((key, PUBLIC_NETWORK), None)
        _known.pop((key, PROXY_NETWORK), None)


def public_network(client: "docker.DockerClient") -> PublicNetwork:
    """The engine's shared public network, created if missing, with the host filter installed where possible.

    Known once per engine and process (`forget` drops it). Thread-safe; concurrent processes creating it race
    harmlessly (the loser inspects the winner's).

    Raises:
        SandboxError: a network of that name exists without inter-container traffic off (not harbor_gym's).
        SandboxUnavailableError: the engine does not answer (retryable).
    """
    net, made = _cached(client, PUBLIC_NETWORK, _OPTIONS, internal=False)
    if made and not net.filtered:
        log.warning("public-network sandboxes are not filtered from the host (%s): they reach %s",
                    net.unfiltered_reason, REACHABLE_WITHOUT_FILTER)
    return net


def proxy_network(client: "docker.DockerClient") -> PublicNetwork:
    """The engine's shared proxy network (``harbor-gym-proxy``, bridge `PROXY_IFACE`): internal, inter-container
    traffic off, created if missing, with the host filter installed where possible (as `public_network`).

    Its sandboxes have no route anywhere; the host drops all they send to it but what an open host route admits
    (`harbor_gym.sandbox.host_route`), and the spoofing guard lets them send IPv4 to its gateway only.

    Raises:
        SandboxError: a network of that name exists that is not internal with inter-container traffic off.
        SandboxUnavailableError: the engine does not answer (retryable).
    """
    return _cached(client, PROXY_NETWORK, _PROXY_OPTIONS, internal=True)[0]


def _cached(client: "docker.DockerClient", name: str, options: dict[str, str], *,
            internal: bool) -> tuple[PublicNetwork, bool]:
    """The known network ``name`` of ``client``'s engine, else `_ensure`d now; and whether it was made now."""
    key = (_engine_key(client), name)
    with _lock:
        known = _known.get(key)
        if known is not None:
            return known, False
        from harbor_gym.sandbox import _podman

        if _podman.is_podman(client):
            # podman's netavark/CNI would make a bridge of Docker's fixed name, which takes Docker's own away
            raise SandboxError(f"refusing to create Docker's network {name} on a podman engine (podman's networks "
                               "are harbor_gym.sandbox._podman_net's)", field="network", rule="GYM-10")
        net = _ensure(client, name, options, internal=internal)
        _known[key] = net
    return net, True


def _engine_key(client: "docker.DockerClient") -> str:
    try:
        return engine_identity(client, engine_info(client))
    except Exception:  # the engine does not answer: key by client, the next call fails as it should
        return str(id(client))


def _ensure(client: "docker.DockerClient", name: str = PUBLIC_NETWORK, options: dict[str, str] = _OPTIONS, *,
            internal: bool = False) -> PublicNetwork:
    import docker.errors

    api = client.api
    try:
        try:
            attrs = api.inspect_network(name)
        except docker.errors.NotFound:
            try:
                api.create_network(name, driver="bridge", options=dict(options), check_duplicate=True,
                                   internal=internal, labels={MANAGED_LABEL: "true",
                                                              SHARED_LABEL: "proxy" if internal else "public"})
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another process created it meanwhile
                    raise
            attrs = api.inspect_network(name)
    except docker.errors.APIError as exc:
        translate_error(exc, what=f"create the network {name}")
    except Exception as exc:
        translate_error(exc, what=f"create the network {name}")
    have = attrs.get("Options") or {}
    if have.get("com.docker.network.bridge.enable_icc") != "false" or bool(attrs.get("Internal")) != internal:
        raise SandboxError(f"a Docker network named {name} exists without inter-container traffic off"
                           f"{'' if internal else ' or internal'}{' or not internal' if internal else ''}; "
                           "it is not harbor_gym's: remove it", field="network", rule="GYM-10")
    gateway = next((c.get("Gateway") for c in (attrs.get("IPAM") or {}).get("Config") or [] if c.get("Gateway")),
                   None)
    iface = have.get("com.docker.network.bridge.name") or options["com.docker.network.bridge.name"]
    if is_remote(client):  # issue 17: the bridge lives on the engine's host, out of this host's firewall
        return PublicNetwork(name, gateway, f"the engine {engine_key(client)} is remote: its bridge {iface} is on "
                             "another host, whose firewall harbor_gym does not set")
    return PublicNetwork(name, gateway, _install_filter(iface, gateway))


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
    public_iface = BRIDGE_IFACE if iface == PROXY_IFACE else iface
    for binary, chain, rule in reversed(filter_rules(public_iface, forward_chain=forward)):
        if binary == "ip6tables" and not have_v6:
            continue
        if _run([binary, *_IPTABLES_WAIT, "-C", chain, *rule]) is None:
            continue
        failed = _run([binary, *_IPTABLES_WAIT, "-I", chain, "1", *rule])
        if failed is not None:
            return f"{binary} -I {chain} {' '.join(rule)} failed: {failed}"
    failed = _route_chain.ensure_first("iptables", "filter")  # host routes' exceptions stay above the drops
    if failed is not None:
        return f"the host route chain could not be installed: {failed}"
    guard = _spoofguard.unavailable_reason()  # GYM-10: no sandbox may send as another
    if guard is not None:
        return guard
    log.info("host filter for %s installed (INPUT drop, forward isolation, spoofing guard)", iface)
    return None


def bind_container(client: "docker.DockerClient", container_id: str) -> list[_spoofguard.Binding]:
    """GYM-10: bind every interface of a started container that is a port of one of harbor_gym's bridges
    (`BRIDGE_IFACE`, `PROXY_IFACE`, a compose group's ``hgg-*``) to the MAC and IPv4 address the engine gave it
    (`harbor_gym.sandbox._spoofguard`). One inspect; the host port is found through the kernel's peer index of the
    interface, read with the host's ``ip`` in the container's network namespace only.

    Returns:
        the bindings made (`unbind_all` removes them).

    Raises:
        SandboxUnavailableError: an interface on such a bridge cannot be found or bound (the caller stops the
            container; bindings made before the failure are removed).
    """
    if is_remote(client):  # its ports are on the engine's host: unguarded, as its network is unfiltered (refused
        return []          # at seed unless EnvConfig.unfiltered_network = "allow")
    try:
        attrs = client.api.inspect_container(container_id)
    except Exception as exc:
        translate_error(exc, what="inspect the container's network", sandbox=container_id[:12])
    settings = attrs.get("NetworkSettings") or {}
    netns = settings.get("SandboxKey") or ""
    networks = settings.get("Networks") or {}
    if not netns or not os.path.exists(netns):
        netns = f"/proc/{int((attrs.get('State') or {}).get('Pid') or 0)}/ns/net"
    from harbor_gym.sandbox import _podman_net  # podman's bridges are bound alike (it imports this module)

    peers = _spoofguard.netns_ports(netns)
    made: list[_spoofguard.Binding] = []
    try:
        for name, endpoint in networks.items():
            mac, ipv4 = (endpoint.get("MacAddress") or "").lower(), endpoint.get("IPAddress")
            if not mac or not ipv4:
                continue
            if mac not in peers:
                raise SandboxUnavailableError(f"the spoofing guard found no interface of MAC {mac} (network {name}) "
                                              "in the container", field="network", rule="GYM-10")
            port, bridge = _spoofguard.host_port(peers[mac])
            group = bridge is not None and bridge.startswith((GROUP_IFACE_PREFIX, _podman_net.GROUP_IFACE_PREFIX))
            if bridge is None or not (bridge in (BRIDGE_IFACE, PROXY_IFACE, _podman_net.BRIDGE_IFACE) or group):
                continue  # not a bridge of harbor_gym's
            gateway = _ipv4_of(bridge) if bridge == PROXY_IFACE else None  # the host's own address there
            if bridge == PROXY_IFACE and gateway is None:
                raise SandboxUnavailableError(f"the bridge {PROXY_IFACE} has no address here", field="network",
                                              rule="GYM-10")
            binding = _spoofguard.Binding(port=port, bridge=bridge, mac=mac, ipv4=ipv4,
                                          isolated=not group, routed_to=gateway, ifindex=peers[mac])
            made.append(binding)
            _spoofguard.bind(binding)
    except BaseException:
        unbind_all(made)
        raise
    return made


def unbind_all(bindings: list[_spoofguard.Binding]) -> None:
    """Remove bindings made by `bind_container` (after the container is gone). Never raises."""
    for binding in bindings:
        _spoofguard.unbind(binding)


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
