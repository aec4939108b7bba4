"""host_route and the spoofing guard, pure parts: spec and binding validation, the network a spec with a host
service port joins, and refusals where no route can be made (simulated; nothing is started). The real routes and
attacks are in tests/hostile/test_host_route.py and tests/hostile/test_spoofing.py."""

from __future__ import annotations

import pytest

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import _netfilter, _spoofguard, host_route
from harbor_gym.sandbox._docker_container import build_host_config
from harbor_gym.sandbox.base import SandboxSpec


@pytest.mark.parametrize("port", [0, 65536, -1, True, "8080", 80.0])
def test_gym_10_host_service_port_must_be_a_tcp_port(port):
    # SPEC: GYM-10 — a bad port is refused when the spec is made, naming the field
    with pytest.raises(ValueError, match="host_service_port"):
        SandboxSpec(image="x", host_service_port=port)


def test_gym_10_a_spec_with_a_port_joins_the_proxy_network_only_without_a_network():
    # SPEC: GYM-10 — no network + port: the proxy network, never "none" silently; public + port: the public one
    routed = SandboxSpec(image="x", host_service_port=8080)
    assert build_host_config(routed, proxy_network="harbor-gym-proxy")["network_mode"] == "harbor-gym-proxy"
    with pytest.raises(ValueError):
        build_host_config(routed)
    public = SandboxSpec(image="x", network=True, host_service_port=8080)
    assert build_host_config(public, public_network="harbor-gym-public",
                             proxy_network="harbor-gym-proxy")["network_mode"] == "harbor-gym-public"
    assert build_host_config(SandboxSpec(image="x"))["network_mode"] == "none"
    assert routed.key() != SandboxSpec(image="x").key()  # pools never hand a routed sandbox to another spec


def test_gym_10_a_binding_refuses_what_is_not_an_interface_mac_or_address():
    # SPEC: GYM-10 — every field of a binding ends up on an nft command line: nothing else gets through
    ok = _spoofguard.Binding("veth1a2b3c", "hg-public0", "02:42:AC:12:00:02", "172.18.0.2", routed_to="172.18.0.1")
    assert ok.mac == "02:42:ac:12:00:02"
    for bad in ({"port": 'x" }; flush ruleset; {'}, {"mac": "02:42:ac:12:00"}, {"ipv4": "172.18.0.2 . 1"},
                {"bridge": "a" * 16}, {"routed_to": "::1"}, {"ifindex": 0}, {"ifindex": True}, {"ifindex": "7"}):
        fields = {"port": "veth1", "bridge": "hg-public0", "mac": "02:42:ac:12:00:02", "ipv4": "172.18.0.2", **bad}
        with pytest.raises(ValueError):
            _spoofguard.Binding(**fields)


def test_gym_10_the_element_script_binds_the_port_last_and_unbinds_it_first():
    # SPEC: GYM-10 — a port joins @ports (is filtered) only once its allowed pairs exist, in one transaction
    b = _spoofguard.Binding("veth1", "hg-proxy0", "02:42:ac:12:00:02", "172.18.0.2", routed_to="172.18.0.1",
                            ifindex=4711)
    add, delete = _spoofguard._element_lines(b, "add"), _spoofguard._element_lines(b, "delete")
    assert "ports" in add[-1] and "ports" in delete[0] and len(add) == 6 and delete == [
        line.replace("add", "delete", 1) for line in reversed(add)]
    assert all("{ 4711" in line and "veth1" not in line for line in add)  # keyed by index, never by name


def test_gym_10_prune_deletes_elements_of_vanished_ports_by_index_only():
    # SPEC: GYM-10 — nft lists a present port's index as its name and a vanished one's as a number: only the
    # vanished ones are deleted, by index
    sets = {"ports": ["lo", "99999"], "ip4_ok": [["99999", "02:42:ac:12:00:02", "172.18.0.2"],
                                                 ["lo", "02:42:ac:12:00:03", "172.18.0.3"]]}
    present = _spoofguard._present_indexes()
    assert _spoofguard._index_of("lo") in present and _spoofguard._index_of("99999") == 99999
    script = _spoofguard._delete_script(sets, lambda index: index not in present)
    assert script.splitlines() == [
        f"delete element bridge {_spoofguard.TABLE} ports {{ 99999 }}",
        f"delete element bridge {_spoofguard.TABLE} ip4_ok {{ 99999 . 02:42:ac:12:00:02 . 172.18.0.2 }}"]


def test_gym_10_no_route_where_the_host_filter_cannot_be_installed(monkeypatch):
    # SPEC: GYM-10 — listen_addresses and open_route refuse naming why (simulated: a rootless engine), and an
    # unknown backend is refused naming the supported ones
    unfiltered = _netfilter.PublicNetwork("harbor-gym-public", None, "simulated: the engine is rootless")
    monkeypatch.setattr(_netfilter, "public_network", lambda client: unfiltered)
    monkeypatch.setattr(_netfilter, "proxy_network", lambda client: unfiltered)
    monkeypatch.setattr(host_route, "_resolve", lambda backend: backend)
    monkeypatch.setattr("harbor_gym.sandbox._engine.get_client", lambda: _FakeClient())
    monkeypatch.setattr("harbor_gym.sandbox._engine.engine_info", lambda client: {})
    for call in (lambda: host_route.listen_addresses("docker"), lambda: host_route.open_route("docker", 8080)):
        with pytest.raises(SandboxUnavailableError) as err:
            call()
        assert err.value.rule == "GYM-10" and "simulated: the engine is rootless" in str(err.value)
    monkeypatch.setattr("harbor_gym.sandbox._engine.engine_info", lambda client: {"Name": "podman-host"})
    with pytest.raises(SandboxUnavailableError, match="podman"):
        host_route.listen_addresses("docker")
    monkeypatch.undo()
    with pytest.raises(SandboxUnavailableError):
        host_route.listen_addresses("kubernetes")


class _FakeClient:
    class api:  # noqa: N801 — the SDK's attribute name
        @staticmethod
        def version():
            return {"Components": [{"Name": "Engine"}]}
