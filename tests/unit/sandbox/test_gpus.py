"""GPUs (Issue 16 item 2): the device request a spec's ``gpus`` becomes, and what counts as a GPU runtime. Pure."""

from __future__ import annotations

import inspect

from harbor_gym.sandbox._docker_container import build_host_config
from harbor_gym.sandbox._gpus import device_requests, gpu_runtime
from harbor_gym.sandbox.base import SandboxSpec


def test_gpus_become_the_device_request_of_docker_run_gpus():
    # as `docker run --gpus 2` sends it: any driver, a count, the "gpu" capability
    assert device_requests(2) == [{"Driver": "", "Count": 2, "DeviceIDs": None, "Capabilities": [["gpu"]],
                                   "Options": {}}]
    assert device_requests(None) == [] and device_requests(0) == []


def _host_config(spec: SandboxSpec) -> dict:
    # build_host_config took the lease file's path while leases were files mounted into the sandbox
    if "lease_path" in inspect.signature(build_host_config).parameters:
        return build_host_config(spec, "/nonexistent/lease")
    return build_host_config(spec)


def test_host_config_carries_the_device_request_only_when_gpus_are_asked():
    assert _host_config(SandboxSpec(image="x", gpus=1))["device_requests"] == device_requests(1)
    assert "device_requests" not in _host_config(SandboxSpec(image="x"))


def test_gpu_runtime_is_the_nvidia_runtime_in_docker_info():
    assert gpu_runtime({"Runtimes": {"runc": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"}}}) \
        == "nvidia"
    assert gpu_runtime({"Runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {}}}) is None
    assert gpu_runtime({}) is None
