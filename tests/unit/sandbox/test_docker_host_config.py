"""_docker_container.build_host_config: a spec's limits become the engine's host config exactly (no Docker needed)."""

from __future__ import annotations

from harbor_gym.sandbox._docker_container import build_host_config
from harbor_gym.sandbox.base import SandboxSpec


def test_load_24_limits_are_enforced_exactly_memory_without_swap():
    # SPEC: LOAD-24 (a resource is honoured exactly: memory has no swap on top, cpus are not rounded)
    spec = SandboxSpec(image="x", cpus=1.5, memory_mb=256, pids_limit=64, storage_mb=100, tmpfs={"/scratch": 8})
    hc = build_host_config(spec)
    assert hc["nano_cpus"] == 1_500_000_000
    assert hc["mem_limit"] == hc["memswap_limit"] == "256m"
    assert hc["pids_limit"] == 64
    assert hc["storage_opt"] == {"size": "100M"}
    assert hc["tmpfs"] == {"/scratch": "size=8m"}
    assert "binds" not in hc  # GYM-10: nothing of the host is mounted (the lease lives in the engine's reaper)
    assert hc["init"] is True and hc["auto_remove"] is True


def test_unset_limits_are_left_out_and_no_network_means_loopback_only():
    hc = build_host_config(SandboxSpec(image="x"))
    assert hc["network_mode"] == "none"
    for key in ("nano_cpus", "mem_limit", "memswap_limit", "pids_limit", "storage_opt", "tmpfs"):
        assert key not in hc
    assert build_host_config(SandboxSpec(image="x", network=True))["network_mode"] == "bridge"
