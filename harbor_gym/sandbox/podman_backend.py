"""`PodmanSandbox`: the `Sandbox` protocol on podman, through its Docker-compatible API (issue 17 item 2).

A `DockerSandbox` whose client is the process's podman client (`harbor_gym.sandbox._podman.podman_client`: the
socket found, or harbor_gym's own ``podman system service``), so lifecycle, exec, the archive channel, leases and
the reaper are Docker's code. What differs is podman's and lives in `_podman` (what the engine can enforce: a
``cpus``/``memory_mb`` it cannot apply is refused, LOAD-24) and `_podman_net` (podman's public network and host
rules, GYM-10).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harbor_gym.sandbox._podman import podman_client
from harbor_gym.sandbox.docker_backend import DockerSandbox

if TYPE_CHECKING:
    import docker

__all__ = ["PodmanSandbox"]


class PodmanSandbox(DockerSandbox):
    """A `Sandbox` backed by one podman container (see `DockerSandbox` for the contract; ``client`` defaults to
    the process's podman client).

    Attributes:
        backend: ``"podman"``.
    """

    backend = "podman"

    @property
    def client(self) -> "docker.DockerClient":
        if self._client is None:
            self._client = podman_client()
        return self._client

    def __repr__(self) -> str:
        return f"PodmanSandbox(name={self.name!r}, state={self._state.value})"
