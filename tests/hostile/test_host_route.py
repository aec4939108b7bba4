"""GYM-10 and issue 18: a route from sandboxes to exactly one TCP port of a host service, and nothing else.

A host TCP echo server bound on every `listen_addresses` address (docker and local, one port P) stands in for the
capture proxy. A no-network Docker sandbox, a public one, a compose group's no-network ``main`` and a no-network
local sandbox reach it at their ``host_service_address``; from each, nothing else is reachable: the gateway's other
ports (a ``0.0.0.0`` listener on port O), 127.0.0.1 of the host (a listener on P itself; 127.0.0.1 is the sandbox's
own), the host's other addresses on P (its uplink's address, the other bridge's gateway, and an address on a dummy
interface made for the test, which stands for "anything outside"), and a sibling sandbox's server. After
`HostRoute.close` P is unreachable too.

Negative controls: every server answers from the host itself; opening a route to O makes O reachable from the same
sandboxes (the probe sees an admitted port, so "blocked" is the firewall's doing); and without its guard binding a
no-network sandbox's raw frames to a non-gateway address do reach the host's side of the bridge, which the guard
stops (its IPv4-to-the-gateway-only restriction).
"""

from __future__ import annotations

import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import _netfilter, _spoofguard, host_route
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec

from .helpers import BASE_IMAGE, LABEL
from .netprobe import RAW_UDP, Servers, capture, mac_of, reached

pytestmark = [pytest.mark.docker, pytest.mark.bwrap]


def _uplink_address() -> str:
    out = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.123"], capture_output=True, text=True).stdout
    return out.split(" src ")[1].split()[0] if " src " in out else "127.0.0.1"


class _Dummy:
    """A test-only interface of this host (a veth pair with both ends here: the kernel has no dummy driver) with
    one address from a documentation range on it, standing for "anything outside" (removed by `close`)."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.iface = f"hgtd{tag}"
        self.address = f"198.51.100.{10 + secrets.randbelow(200)}"
        subprocess.run(["ip", "link", "add", self.iface, "type", "veth", "peer", "name", f"hgte{tag}"], check=True)
        subprocess.run(["ip", "addr", "add", f"{self.address}/32", "dev", self.iface], check=True)
        subprocess.run(["ip", "link", "set", self.iface, "up"], check=True)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.iface], check=False)


def _in_parallel(jobs: dict) -> dict:
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(fn) for name, fn in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def test_gym_10_sandboxes_reach_one_host_port_and_nothing_else(docker_client, tmp_path):
    # SPEC: GYM-10 — (issue 18) the route admits exactly one host port, from every kind of sandbox, until closed
    from harbor_gym import sandbox as sandbox_pkg
    from harbor_gym.sandbox.compose import ComposeGroup
    from harbor_gym.sandbox.local import LocalSandbox, _net
    from harbor_gym.task.compose import parse_compose_text

    docker_addrs, local_addrs = host_route.listen_addresses("docker"), host_route.listen_addresses("local")
    servers, dummy = Servers(), _Dummy()
    routes: list[host_route.HostRoute] = []
    try:
        port = servers.bind(docker_addrs[0])
        for addr in (*docker_addrs[1:], *local_addrs, "127.0.0.1", _uplink_address(), dummy.address):
            servers.bind(addr, port)
        other = servers.bind("0.0.0.0")
        for addr in (*docker_addrs, *local_addrs, "127.0.0.1", _uplink_address(), dummy.address):  # positive control
            for p in (port, other):
                reached_from_host = subprocess.run(["python3", "-c", "import socket,sys; socket.create_connection("
                                                    "(sys.argv[1], int(sys.argv[2])), timeout=3)", addr, str(p)])
                assert reached_from_host.returncode == 0, (addr, p)
        routes += [host_route.open_route("docker", port), host_route.open_route("local", port)]

        dsettings = SandboxSettings.from_config(EnvConfig.coerce({"backend": "docker", "labels": dict([LABEL])}))
        lsettings = SandboxSettings.from_config(EnvConfig(labels=dict([LABEL])))
        routed = SandboxSpec(image=BASE_IMAGE, host_service_port=port, name_hint="route")
        public = SandboxSpec(image=BASE_IMAGE, network=True, host_service_port=port, name_hint="route-pub")
        env = tmp_path / "environment"
        env.mkdir()
        text = f"services:\n  main:\n    image: {BASE_IMAGE}\n"
        (env / "docker-compose.yaml").write_text(text)
        group = ComposeGroup(parse_compose_text(text, path=env / "docker-compose.yaml"), settings=dsettings,
                             main_spec=routed, name_hint="route-group")
        with sandbox_pkg.open(routed, backend="docker", settings=dsettings) as p1, \
                sandbox_pkg.open(routed, backend="docker", settings=dsettings) as p2, \
                sandbox_pkg.open(public, backend="docker", settings=dsettings) as pub, \
                LocalSandbox(routed, lsettings) as loc, group:
            main = group.main
            sandboxes = {"docker-no-network": p1, "docker-public": pub, "compose-main": main, "local": loc}
            nets = docker_client.api.inspect_container(p1.container_id)["NetworkSettings"]["Networks"]
            assert list(nets) == [_netfilter.PROXY_NETWORK]
            main_nets = docker_client.api.inspect_container(main.container_id)["NetworkSettings"]["Networks"]
            assert set(main_nets) == {group.name, _netfilter.PROXY_NETWORK}
            assert p1.host_service_address == f"{docker_addrs[1]}:{port}" == main.host_service_address
            assert pub.host_service_address == f"{docker_addrs[0]}:{port}"
            assert loc.host_service_address == f"{local_addrs[0]}:{port}"

            # a sibling's server on the proxy network (reachable inside that sibling itself)
            p2.exec("nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 &", timeout=30)
            sibling = p2.client.api.inspect_container(p2.container_id)["NetworkSettings"]["Networks"][
                _netfilter.PROXY_NETWORK]["IPAddress"]
            for _ in range(50):
                if reached(p2, ["127.0.0.1:8000"]):
                    break

            def blocked_targets(sb) -> list[str]:
                own = sb.host_service_address.rsplit(":", 1)[0]
                others = [a for a in (*docker_addrs, *local_addrs) if a != own]
                return [f"{own}:{other}", f"127.0.0.1:{port}", f"127.0.0.1:{other}", f"{_uplink_address()}:{port}",
                        f"{dummy.address}:{port}", f"{dummy.address}:{other}", f"{sibling}:8000",
                        *(f"{a}:{port}" for a in others)]

            seen = _in_parallel({name: (lambda sb=sb: reached(sb, [sb.host_service_address, *blocked_targets(sb)]))
                                 for name, sb in sandboxes.items()})
            for name, sb in sandboxes.items():
                assert seen[name] == [sb.host_service_address], (name, seen[name])

            # negative control: a route to O admits O; the closed route's P is no longer reachable
            routes += [host_route.open_route("docker", other), host_route.open_route("local", other)]
            routes[0].close()
            routes[1].close()
            assert not host_route.route_is_open("docker", port) and not host_route.route_is_open("local", port)
            seen = _in_parallel({name: (lambda sb=sb: reached(sb, [sb.host_service_address,
                                                                   sb.host_service_address.rsplit(":", 1)[0]
                                                                   + f":{other}"]))
                                 for name, sb in sandboxes.items()})
            for name, sb in sandboxes.items():
                assert seen[name] == [sb.host_service_address.rsplit(":", 1)[0] + f":{other}"], (name, seen[name])

            # the guard keeps a no-network sandbox's IPv4 to its gateway; without its binding (negative control)
            # raw frames to another address reach the host's side of the bridge
            for sb, binding in ((p1, p1._bindings[0]), (loc, _net._bindings[loc._address])):
                assert binding.routed_to == sb.host_service_address.rsplit(":", 1)[0]
                argv = ["python3", "-c", RAW_UDP, "eth0", binding.mac, mac_of(binding.bridge), binding.ipv4,
                        dummy.address]
                with capture(binding.bridge, binding.mac, dst=dummy.address) as guarded:
                    assert "SENT" in sb.exec(argv, timeout=60, user="root").stdout
                _spoofguard.unbind(binding)
                with capture(binding.bridge, binding.mac, dst=dummy.address) as unguarded:
                    assert "SENT" in sb.exec(argv, timeout=60, user="root").stdout
                assert guarded.to == 0 and unguarded.to > 0, (binding.bridge, guarded, unguarded)
    finally:
        for route in routes:
            route.close()
        servers.close()
        dummy.close()


def test_gym_10_a_spec_naming_a_port_is_refused_without_an_open_route(docker_client):
    # SPEC: GYM-10 — (issue 18) no route open to the port: refused at start on both backends, nothing left behind
    from harbor_gym import sandbox as sandbox_pkg
    from harbor_gym.sandbox.local import LocalSandbox

    port = 1 + secrets.randbelow(20000) + 40000
    assert not host_route.route_is_open("docker", port) and not host_route.route_is_open("local", port)
    spec = SandboxSpec(image=BASE_IMAGE, host_service_port=port, name_hint="unrouted")
    dsettings = SandboxSettings.from_config(EnvConfig.coerce({"backend": "docker", "labels": dict([LABEL])}))
    for sb in (sandbox_pkg.create(spec, backend="docker", settings=dsettings),
               LocalSandbox(spec, SandboxSettings.from_config(EnvConfig(labels=dict([LABEL]))))):
        with pytest.raises(SandboxUnavailableError) as err:
            sb.start()
        assert err.value.rule == "GYM-10" and err.value.field == "host_service_port"
        assert f"host_service_port={port}" in str(err.value) and "open_route" in str(err.value)
        assert sb.host_service_address is None
