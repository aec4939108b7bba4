"""GPUs for Docker sandboxes: whether the engine has a GPU runtime, and the device request a spec's ``gpus`` becomes.

An engine "has a GPU runtime" when ``docker info`` lists a runtime named ``nvidia`` (the NVIDIA Container Toolkit
registers it; Docker's ``--gpus`` needs it). Then ``[environment].gpus = N`` passes through as the device request
``docker run --gpus N`` sends: driver ``""`` (the engine picks), ``Count`` N, capabilities ``[["gpu"]]``. Without
one, a task asking for GPUs is refused at seed (LOAD-24), saying so. ``gpu_types`` cannot be honoured exactly by a
device request (it selects a count, not a model) and stays refused (LOAD-24).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["GPU_RUNTIME", "gpu_runtime", "device_requests", "engine_gpu_runtime"]

#: The runtime name that marks an engine able to hand GPUs to containers.
GPU_RUNTIME = "nvidia"

_lock = threading.Lock()
_cached: dict[str, str | None] = {}


def gpu_runtime(info: Mapping[str, Any]) -> str | None:
    """The GPU runtime named in an engine's ``docker info`` (``Runtimes``), or ``None``. Pure."""
    runtimes = info.get("Runtimes") or {}
    return GPU_RUNTIME if GPU_RUNTIME in runtimes else None


def device_requests(count: int | None) -> list[dict[str, Any]]:
    """The engine's ``HostConfig.DeviceRequests`` for ``count`` GPUs (``-1``: all), as ``docker run --gpus`` builds
    them; ``[]`` for ``None``/0. Pure."""
    if not count:
        return []
    return [{"Driver": "", "Count": int(count), "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]


def engine_gpu_runtime() -> str | None:
    """`gpu_runtime` of the local Docker engine (asked once per process); ``None`` when no engine answers."""
    with _lock:
        if "engine" in _cached:
            return _cached["engine"]
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            answer = gpu_runtime(client.info())
        finally:
            client.close()
    except Exception:  # no SDK or no engine: no GPU runtime to use
        answer = None
    with _lock:
        _cached["engine"] = answer
    return answer
