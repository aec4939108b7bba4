"""A `DockerSandbox`'s container creation: labels, host config (limits; LOAD-24 refusals), create and start.

`build_host_config` is pure (spec -> the engine's host config); `DockerContainerMixin` (mixed into
`DockerSandbox`) refuses what the engine cannot enforce, resolves the image, creates and starts the container.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import images
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox._engine import engine_info, translate_error
from harbor_gym.sandbox.base import MANAGED_LABEL, RUN_LABEL, SandboxSettings, SandboxSpec, SandboxState

if TYPE_CHECKING:
    import docker

__all__ = ["TTL_LABEL", "DockerContainerMixin", "build_host_config", "storage_limit_supported"]

log = logging.getLogger("harbor_gym.sandbox")

#: The lease TTL (seconds) a container was started with; ``harbor-gym gc`` judges its run's lease by it.
TTL_LABEL = "io.harbor-gym.lease-ttl"


def storage_limit_supported(info: Mapping[str, Any]) -> bool:
    """True iff the engine can enforce a per-container storage size (overlay2 on xfs; devicemapper; btrfs; zfs).

    overlay2 on xfs additionally needs the ``pquota`` mount option, which the engine reports only when a
    container is created; such a refusal is turned into `SandboxUnavailableError` then."""
    driver = str(info.get("Driver", ""))
    status = {str(k): str(v) for k, v in (info.get("DriverStatus") or [])}
    if driver == "overlay2":
        return status.get("Backing Filesystem", "").lower() == "xfs"
    return driver in ("devicemapper", "btrfs", "zfs", "windowsfilter")


def build_host_config(spec: SandboxSpec, lease_path: Path | str) -> dict[str, Any]:
    """The keyword arguments of ``create_host_config`` for ``spec``.

    That is: an init process, auto-remove, the network on or off, the lease file mounted read-only, and the
    spec's limits (cpus, memory without swap, pids, storage, tmpfs sizes). Pure; a limit the engine cannot
    enforce is refused before this is built (``_refuse_unenforceable``, SPEC LOAD-24)."""
    host_config: dict[str, Any] = {
        "init": True,
        "auto_remove": True,
        "network_mode": "bridge" if spec.network else "none",
        "binds": {str(lease_path): {"bind": leases.LEASE_MOUNT, "mode": "ro"}},
    }
    if spec.cpus is not None:
        host_config["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.memory_mb is not None:
        host_config["mem_limit"] = f"{spec.memory_mb}m"
        host_config["memswap_limit"] = f"{spec.memory_mb}m"
    if spec.pids_limit is not None:
        host_config["pids_limit"] = spec.pids_limit
    if spec.storage_mb is not None:
        host_config["storage_opt"] = {"size": f"{spec.storage_mb}M"}
    if spec.tmpfs:
        host_config["tmpfs"] = {path: f"size={mb}m" for path, mb in spec.tmpfs.items()}
    return host_config


class DockerContainerMixin:
    """Start-time container work of `DockerSandbox`: LOAD-24 refusals, image, labels, create and start."""

    if TYPE_CHECKING:  # provided by `DockerSandbox`
        spec: SandboxSpec
        settings: SandboxSettings
        name: str
        container_id: str | None
        run_id: str | None
        _state: SandboxState
        _image: images.ImageInfo | None
        _lease: leases.Lease | None

        @property
        def client(self) -> docker.DockerClient: ...
        def _count(self, n: int = 1) -> None: ...

    def _refuse_unenforceable(self) -> None:
        spec = self.spec
        if spec.gpus:
            raise SandboxUnavailableError(
                f"sandbox {self.name}: gpus={spec.gpus} requested but the docker backend here is CPU-only",
                field="gpus", rule="LOAD-24")
        if spec.storage_mb is not None:
            if not storage_limit_supported(engine_info(self.client)):
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb={spec.storage_mb} cannot be enforced by this engine's storage "
                    "driver (needs overlay2 on xfs with pquota, btrfs, zfs or devicemapper)",
                    field="storage_mb", rule="LOAD-24")

    def _start(self) -> None:
        import docker.errors

        spec = self.spec
        lease = self._lease or leases.process_lease()
        lease.want_ttl(self.settings.lease_ttl_s)
        self.run_id = lease.run_id
        self._image = images.ensure_image(self.client, spec, self.settings)
        labels = {**dict(self.settings.labels), **dict(spec.labels),
                  MANAGED_LABEL: "true", RUN_LABEL: lease.run_id, TTL_LABEL: f"{self.settings.lease_ttl_s:g}"}
        api = self.client.api
        host_config = build_host_config(spec, lease.path)
        try:
            created = self._create(api, labels, host_config)
            self.container_id = created["Id"]
            api.start(self.container_id)
            self._count()
        except docker.errors.APIError as exc:
            text = str(getattr(exc, "explanation", "") or exc)
            if spec.storage_mb is not None and ("storage-opt" in text or "quota" in text):
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb cannot be enforced here: {text}", field="storage_mb",
                    rule="LOAD-24") from exc
            translate_error(exc, what="create and start the container", sandbox=self.name)
        except Exception as exc:
            translate_error(exc, what="create and start the container", sandbox=self.name)
        self._state = SandboxState.RUNNING
        log.debug("sandbox %s started (container %s, image %s)", self.name, self.container_id, self._image.ref)

    def _create(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        """Create the container; an image removed since it was inspected (gc) is resolved once more."""
        import docker.errors

        try:
            return self._create_once(api, labels, host_config)
        except docker.errors.ImageNotFound:
            images.forget(self.client, self._image.ref)
            self._image = images.ensure_image(self.client, self.spec, self.settings)
            return self._create_once(api, labels, host_config)

    def _create_once(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        spec = self.spec
        self._count()
        return api.create_container(
            self._image.id,
            command=leases.lease_command(self.settings.lease_ttl_s),
            entrypoint=[],
            name=self.name,
            hostname=self.name[:63],
            labels=labels,
            environment=dict(spec.env),
            working_dir=spec.workdir,
            user=spec.user,
            host_config=api.create_host_config(**host_config),
        )
