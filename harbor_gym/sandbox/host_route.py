"""A route from sandboxes to exactly one TCP port of a service on the trainer's host (issue 18's capture proxy).

A host service (in this process, e.g. the model capture proxy) binds its port on every address of
`listen_addresses`; `open_route` admits TCP to that port on those addresses from sandboxes, and nothing else becomes
reachable. A sandbox asks for it with `SandboxSpec.host_service_port`; after start, `Sandbox.host_service_address`
is the ``"IP:PORT"`` to use inside. A spec naming a port for which no route is open is refused at start.

It is built at the network level, with no process inside the sandbox (none would work in every task image):

- **docker**: a sandbox without a network joins ``harbor-gym-proxy`` (bridge ``hg-proxy0``; internal, traffic
  between containers off, shared like the public network: `harbor_gym.sandbox._netfilter.proxy_network`) instead
  of none; a public sandbox stays on ``hg-public0``; a compose group's ``main`` joins ``hg-proxy0`` besides its
  group's network (or ``hg-public0`` when public). The address is the bridge's gateway (the host's own address on
  it).
- **local**: a sandbox without a network gets ``eth0`` on ``hg-local0`` with no default route; a public one keeps
  its own. The address is the bridge's (`harbor_gym.sandbox.local._net`).

What holds it (GYM-10): the host drops everything those bridges send to it (``INPUT`` drops, and the mangle table's
for ``hg-local0``) except what the chain ``HG-HOST-ROUTE``, jumped to first in ``INPUT`` (`_route_chain`),
accepts: one rule per open route and bridge, TCP to the port on the bridge's own address. Everything forwarded from
``hg-proxy0`` is dropped, and the spoofing guard (`harbor_gym.sandbox._spoofguard`) lets a sandbox without a
network send IPv4 only to its bridge's address, from its own address: no egress, no sibling, not the host's other
addresses or ports, not 127.0.0.1 (the sandbox's own), not a ``0.0.0.0`` listener on another port. `HostRoute.close`
removes the rules (then the port is unreachable too).

Each rule names its owner (pid and start time) in a comment: routes are counted per process (several `open_route`
of one port share rules; the last `close` removes them), closed at interpreter exit, and rules of processes that
are gone (SIGKILL) are removed by the next `open_route`, so a port a dead trainer opened never stays reachable.

Refused, naming why, where no such route can be made: a remote or rootless engine (its bridges are not in this
host's network namespace), podman, not root, no iptables or nft, an unknown backend.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import _netfilter, _route_chain

__all__ = ["HostRoute", "listen_addresses", "open_route", "route_is_open", "require_route", "BACKENDS"]

log = logging.getLogger("harbor_gym.sandbox")

#: The backends that can route to a host service.
BACKENDS = ("docker", "local")
_TIMEOUT_S = 30.0
_OWNER = re.compile(r"hg-route:(\d+):(\d+)")


@dataclass(frozen=True)
class _Target:
    """One bridge through which sandboxes reach the host: its interface, the host's address on it, and the
    iptables tables whose INPUT drops it (each gets the route's ACCEPT in its `_route_chain.CHAIN`)."""

    iface: str
    address: str
    tables: tuple[str, ...]


def _resolve(backend: str) -> str:
    from harbor_gym.sandbox import choose_backend

    name = choose_backend(backend)
    if name not in BACKENDS:
        raise SandboxUnavailableError(f"the {name!r} backend has no route to a host service (supported: "
                                      f"{', '.join(BACKENDS)})", field="host_service_port", rule="GYM-10")
    return name


def _refused(backend: str, why: str) -> SandboxUnavailableError:
    return SandboxUnavailableError(f"no route from {backend} sandboxes to a host service here: {why}",
                                   field="host_service_port", rule="GYM-10")


def _targets(backend: str) -> list[_Target]:
    """The bridges of ``backend`` (created and filtered if missing). Raises `SandboxUnavailableError` naming why
    there is no route here."""
    if backend == "local":
        from harbor_gym.sandbox.local import _net

        reason = _net.filter_unavailable_reason()
        if reason is not None:
            raise _refused(backend, reason)
        _net.ensure_bridge()
        return [_Target(_net.BRIDGE, str(_net.gateway()), ("mangle", "filter"))]
    from harbor_gym.sandbox._engine import engine_info, get_client, translate_error

    client = get_client()
    try:
        info = engine_info(client)
        version = client.api.version()
    except Exception as exc:
        translate_error(exc, what="ask the engine what it is")
    components = " ".join(str(c.get("Name", "")) for c in version.get("Components") or [])
    if "podman" in components.lower() or "podman" in str(info.get("Name", "")).lower():
        raise _refused(backend, "the engine is podman, whose networks harbor_gym does not filter")
    if any("rootless" in str(opt) for opt in info.get("SecurityOptions") or []):
        raise _refused(backend, "the engine is rootless: its bridges are not in this host's network namespace")
    targets = []
    for iface, net in ((_netfilter.BRIDGE_IFACE, _netfilter.public_network(client)),
                       (_netfilter.PROXY_IFACE, _netfilter.proxy_network(client))):
        if not net.filtered:
            raise _refused(backend, net.unfiltered_reason or "the host filter is not installed")
        if not net.gateway:
            raise _refused(backend, f"the network {net.name} has no gateway address")
        targets.append(_Target(iface, net.gateway.split("/")[0], ("filter",)))
    return targets


def listen_addresses(backend: str) -> tuple[str, ...]:
    """Host IPv4 addresses a host service must bind (all of them, same port) so that every sandbox of ``backend``
    asking for it can reach it; ensures the networks/bridges exist.

    Args:
        backend: ``"docker"``, ``"local"`` or ``"auto"`` (`harbor_gym.sandbox.choose_backend`).

    Returns:
        the addresses (docker: the gateways of ``hg-public0`` and ``hg-proxy0``; local: ``hg-local0``'s).

    Raises:
        SandboxUnavailableError: no route is possible here, naming why (remote or rootless engine, podman, not
            root, no iptables/nft, an unknown backend).
    """
    return tuple(t.address for t in _targets(_resolve(backend)))


class HostRoute:
    """An open route from sandboxes of one backend to one host TCP port (`open_route`); a context manager.

    Attributes:
        backend: the concrete backend.
        port: the TCP port.
        addresses: the host addresses admitted (as `listen_addresses`).
    """

    def __init__(self, backend: str, port: int, targets: list[_Target]) -> None:
        self.backend = backend
        self.port = port
        self._targets = targets
        self.addresses = tuple(t.address for t in targets)
        self._closed = False

    def close(self) -> None:
        """Remove the route (the last open route of the port in this process removes the rules). Idempotent."""
        with _lock:
            if self._closed:
                return
            self._closed = True
            if self in _routes:
                _routes.remove(self)
            key = (self.backend, self.port)
            _open[key] -= 1
            if _open[key] > 0:
                return
            del _open[key]
            for target in self._targets:
                for table in target.tables:
                    _run(["iptables", "-w", "10", "-t", table, "-D", _route_chain.CHAIN,
                          *_rule(target, self.port)])
        log.info("host route to tcp port %d for %s sandboxes closed", self.port, self.backend)

    @property
    def closed(self) -> bool:
        """True once `close` ran."""
        return self._closed

    def __enter__(self) -> "HostRoute":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HostRoute(backend={self.backend!r}, port={self.port}, addresses={self.addresses}, closed={self._closed})"


_lock = threading.Lock()
_open: dict[tuple[str, int], int] = {}
_routes: list[HostRoute] = []


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def _start_time(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (field 22 of its stat), or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner() -> str:
    return f"hg-route:{os.getpid()}:{_start_time(os.getpid())}"


def _rule(target: _Target, port: int) -> list[str]:
    return ["-i", target.iface, "-d", f"{target.address}/32", "-p", "tcp", "-m", "tcp", "--dport", str(port),
            "-m", "comment", "--comment", _owner(), "-j", "ACCEPT"]


def _listed(table: str) -> list[list[str]]:
    out = _run(["iptables", "-w", "10", "-t", table, "-S", _route_chain.CHAIN])
    return [shlex.split(line) for line in out.stdout.splitlines() if line.startswith(f"-A {_route_chain.CHAIN} ")]


def _prune(tables: tuple[str, ...]) -> None:
    """Delete route rules whose owning process is gone (a SIGKILLed trainer's)."""
    for table in tables:
        for argv in _listed(table):
            match = _OWNER.search(" ".join(argv))
            if match and _start_time(int(match.group(1))) == match.group(2):
                continue
            _run(["iptables", "-w", "10", "-t", table, "-D", *argv[1:]])
            log.info("removed a stale host route rule: %s", " ".join(argv))


def open_route(backend: str, port: int) -> HostRoute:
    """Admit TCP to ``port`` on the `listen_addresses` of ``backend`` from its sandboxes (and nothing else).

    Idempotent per process (each call returns a route to close; the rules go with the last). Closed at exit.

    Raises:
        SandboxUnavailableError: as `listen_addresses`, or the firewall refused the rule.
        ValueError: ``port`` is not a TCP port.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"open_route: port must be a TCP port (1..65535), got {port!r}")
    name = _resolve(backend)
    targets = _targets(name)
    with _lock:
        tables = tuple(sorted({t for target in targets for t in target.tables}))
        _prune(tables)
        for table in tables:
            failed = _route_chain.ensure_first("iptables", table)
            if failed is not None:
                raise _refused(name, f"the host route chain could not be installed: {failed}")
        for target in targets:
            for table in target.tables:
                rule = _rule(target, port)
                if _run(["iptables", "-w", "10", "-t", table, "-C", _route_chain.CHAIN, *rule]).returncode == 0:
                    continue
                done = _run(["iptables", "-w", "10", "-t", table, "-A", _route_chain.CHAIN, *rule])
                if done.returncode != 0:
                    raise _refused(name, f"iptables refused the route rule: {done.stderr.strip()[-300:]}")
        _open[(name, port)] = _open.get((name, port), 0) + 1
        route = HostRoute(name, port, targets)
        _routes.append(route)
    log.info("host route to tcp port %d on %s open for %s sandboxes", port, ", ".join(route.addresses), name)
    return route


def route_is_open(backend: str, port: int, iface: str | None = None) -> bool:
    """True iff a route to ``port`` is open for ``backend`` (by this process, or by a live one on this host whose
    rule admits ``iface``)."""
    with _lock:
        if _open.get((backend, port)):
            return True
    for argv in _listed("filter"):
        text = " ".join(argv)
        match = _OWNER.search(text)
        if (f"--dport {port} " in text + " " and (iface is None or f"-i {iface} " in text)
                and match and _start_time(int(match.group(1))) == match.group(2)):
            return True
    return False


def require_route(backend: str, port: int | None, iface: str | None, *, sandbox: str) -> None:
    """Refuse a sandbox start whose spec names a port without an open route.

    Raises:
        SandboxUnavailableError: no route to ``port`` is open (GYM-10), naming the sandbox and the fix.
    """
    if port is None or route_is_open(backend, port, iface):
        return
    raise SandboxUnavailableError(
        f"sandbox {sandbox}: its spec names host_service_port={port} but no route to that port is open for "
        f"{backend} sandboxes (open one with harbor_gym.sandbox.host_route.open_route({backend!r}, {port}))",
        field="host_service_port", rule="GYM-10")


@atexit.register
def _close_all() -> None:
    for route in list(_routes):
        try:
            route.close()
        except Exception:  # at exit: a rule left is pruned by the next open_route
            pass
