"""A `DockerSandbox`'s container creation: labels, host config (limits), create and start.

`build_host_config` is pure (spec -> the engine's host config); `DockerContainerMixin` (mixed into
`DockerSandbox`) refuses what the engine cannot enforce, resolves the image, creates and starts the container.
GYM-10: a storage size is applied through ``storage_opt`` wherever the engine bounds it (never a LOAD-24 refusal);
an engine that cannot is refused naming what it needs. A public network is the shared filtered one
(`harbor_gym.sandbox._netfilter`), never the default bridge; a spec without a network that names a
``host_service_port`` joins the shared internal proxy network instead of none (`harbor_gym.sandbox.host_route`), and
is refused unless a route to that port is open. Every interface on one of harbor_gym's bridges is bound by the
spoofing guard right after start, before any command runs (`_netfilter.bind_container`), and unbound at stop.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Mapping

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox._gpus import GPU_RUNTIME, device_requests, gpu_runtime
from harbor_gym.sandbox import _netfilter, _podman, _podman_net, _reaper, images
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox._engine import storage_driver_support, storage_support, translate_error
from harbor_gym.sandbox.base import MANAGED_LABEL, RUN_LABEL, SandboxSettings, SandboxSpec, SandboxState

if TYPE_CHECKING:
    import docker

__all__ = ["TTL_LABEL", "DockerContainerMixin", "build_host_config", "storage_limit_supported",
           "storage_size_mb"]

log = logging.getLogger("harbor_gym.sandbox")

#: The lease TTL (seconds) a container was started with; ``harbor-gym gc`` judges its run's lease by it.
TTL_LABEL = "io.harbor-gym.lease-ttl"


def storage_limit_supported(info: Mapping[str, Any]) -> bool:
    """True iff ``docker info`` shows a storage driver that bounds a container's size (GYM-10; see
    `harbor_gym.sandbox._engine.storage_driver_support`, whose probe create confirms it)."""
    return storage_driver_support(info).supported


def storage_size_mb(storage_mb: int, *, image_bytes: int, includes_image: bool) -> int:
    """GYM-10, pure: the ``storage_opt`` size (MiB) bounding the writable size at ``storage_mb``; a driver whose
    limit counts the image's own bytes (btrfs) gets the image's size on top."""
    return storage_mb + ((image_bytes + (1 << 20) - 1) >> 20 if includes_image else 0)


def build_host_config(spec: SandboxSpec, *, public_network: str = "bridge",
                      storage_size: int | None = None, proxy_network: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``create_host_config`` for ``spec``.

    That is: an init process, auto-remove, the network (``public_network`` when the spec's network is on, else
    ``proxy_network`` when it names a ``host_service_port``, else none), nothing of the host mounted (the lease is enforced by the engine's reaper, `_reaper`), and the spec's
    limits (cpus, memory without swap, pids, storage,
    tmpfs sizes). ``storage_size`` (MiB) is the engine size bounding ``spec.storage_mb`` (`storage_size_mb`;
    default: ``storage_mb`` itself). Pure; a limit the engine cannot enforce is refused before this is built
    (``_refuse_unenforceable``; GYM-10, LOAD-24)."""
    if not spec.network and spec.host_service_port is not None and not proxy_network:
        raise ValueError("a spec naming host_service_port without a network needs the proxy network")
    network_mode = public_network if spec.network else (
        proxy_network if spec.host_service_port is not None else "none")
    host_config: dict[str, Any] = {
        "init": True,
        "auto_remove": True,
        "network_mode": network_mode,
    }
    if spec.cpus is not None:
        host_config["nano_cpus"] = int(spec.cpus * 1e9)
    if spec.memory_mb is not None:
        host_config["mem_limit"] = f"{spec.memory_mb}m"
        host_config["memswap_limit"] = f"{spec.memory_mb}m"
    if spec.pids_limit is not None:
        host_config["pids_limit"] = spec.pids_limit
    if spec.storage_mb is not None:
        host_config["storage_opt"] = {"size": f"{storage_size or spec.storage_mb}M"}
    if spec.tmpfs:
        host_config["tmpfs"] = {path: f"size={mb}m" for path, mb in spec.tmpfs.items()}
    if spec.gpus:
        host_config["device_requests"] = device_requests(spec.gpus)  # refused first without a GPU runtime
    return host_config


def _podman_refusals(sandbox: Any) -> None:
    """LOAD-24 on podman: refuse the ``cpus``/``memory_mb`` (a compose service's memory too) its engine cannot
    apply; log once that ``pids_limit`` is not applied there (`harbor_gym.sandbox._podman`). No-op on Docker."""
    engine = _podman.engine_of(sandbox.client)
    if engine is None:
        return
    spec = sandbox.spec
    memory = getattr(sandbox, "_memory_bytes", None)  # a sidecar's compose size (COMPOSE-2)
    if memory is not None and spec.memory_mb is None:
        spec = dataclasses.replace(spec, memory_mb=max(1, memory >> 20))
    refused = _podman.limit_refusals(spec, engine)
    if refused:
        raise SandboxUnavailableError(f"sandbox {sandbox.name}: {'; '.join(refused)}",
                                      field="cpus" if refused[0].startswith("cpus") else "memory_mb",
                                      rule="LOAD-24")
    _podman.warn_unapplied(spec, engine)


class DockerContainerMixin:
    """Start-time container work of `DockerSandbox`: refusals (LOAD-24, GYM-10), image, labels, create, start."""

    if TYPE_CHECKING:  # provided by `DockerSandbox`
        spec: SandboxSpec
        settings: SandboxSettings
        name: str
        container_id: str | None
        run_id: str | None
        _state: SandboxState
        _image: images.ImageInfo | None
        _lease: leases.Lease | None
        _bindings: list
        _host_service_address: str | None

        @property
        def client(self) -> docker.DockerClient: ...
        def _count(self, n: int = 1) -> None: ...

    def _refuse_unenforceable(self) -> None:
        spec = self.spec
        if spec.gpus and gpu_runtime(self.client.info()) is None:
            raise SandboxUnavailableError(
                f"sandbox {self.name}: gpus={spec.gpus} requested but this Docker engine has no GPU runtime "
                f"('{GPU_RUNTIME}' is not among its runtimes)", field="gpus", rule="LOAD-24")
        _podman_refusals(self)
        if spec.storage_mb is not None:
            support = storage_support(self.client)
            if not support.supported:
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb={spec.storage_mb} cannot be bounded here: {support.reason}",
                    field="storage_mb", rule="GYM-10")

    def _start(self) -> None:
        import docker.errors

        spec = self.spec
        lease = self._lease or leases.process_lease()
        lease.want_ttl(self.settings.lease_ttl_s)
        _reaper.attach(lease, self.client, self.settings)  # GYM-10: the lease is enforced outside the sandbox
        self.run_id = lease.run_id
        self._image = images.ensure_image(self.client, spec, self.settings)
        labels = {**dict(self.settings.labels), **dict(spec.labels),
                  MANAGED_LABEL: "true", RUN_LABEL: lease.run_id, TTL_LABEL: f"{self.settings.lease_ttl_s:g}",
                  **_reaper.lease_labels(lease.run_id)}
        api = self.client.api
        size = None
        if spec.storage_mb is not None:
            size = storage_size_mb(spec.storage_mb, image_bytes=self._image.size_bytes,
                                   includes_image=storage_support(self.client).includes_image)
        network = self._public_network() if spec.network else "bridge"
        proxy = self._host_route() if spec.host_service_port is not None else None
        host_config = build_host_config(spec, public_network=network, storage_size=size, proxy_network=proxy)
        try:
            created = self._create(api, labels, host_config)
            self.container_id = created["Id"]
            api.start(self.container_id)
            self._count()
        except docker.errors.APIError as exc:
            text = str(getattr(exc, "explanation", "") or exc)
            if spec.storage_mb is not None and ("storage-opt" in text or "quota" in text):
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb cannot be bounded here: {text}", field="storage_mb",
                    rule="GYM-10") from exc
            translate_error(exc, what="create and start the container", sandbox=self.name)
        except Exception as exc:
            translate_error(exc, what="create and start the container", sandbox=self.name)
        if self._joins_bridges() and self._guarded():
            try:
                self._bindings = _netfilter.bind_container(self.client, self.container_id)  # GYM-10: no spoofing
            except SandboxUnavailableError:
                # A container that already exited (a sidecar crashing at start) has no network namespace left to
                # guard, and none of harbor_gym's containers restart: let its exit be reported, not the guard's.
                if self._still_running():
                    raise
                log.debug("sandbox %s exited before its ports could be bound; nothing left to guard", self.name)
            self._count()
        self._state = SandboxState.RUNNING
        log.debug("sandbox %s started (container %s, image %s)", self.name, self.container_id, self._image.ref)

    def _still_running(self) -> bool:
        """True unless an inspect says the container is not running (an engine that does not answer: True)."""
        try:
            return bool((self.client.api.inspect_container(self.container_id).get("State") or {}).get("Running"))
        except Exception:  # unknown: keep the guard's error
            return True

    def _public_network(self) -> str:
        """GYM-10: the shared, host-filtered network; where the filter cannot be installed, refused unless
        ``settings.unfiltered_network`` is ``"allow"`` (the episode refuses such tasks at seed already)."""
        net = _podman_net.public_network(self.client)  # Docker's (`_netfilter`), or podman's own
        if not net.filtered and getattr(self.settings, "unfiltered_network", "refuse") != "allow":
            raise SandboxUnavailableError(
                f"sandbox {self.name}: a public network cannot be filtered from the host here "
                f"({net.unfiltered_reason}); it would reach {_netfilter.REACHABLE_WITHOUT_FILTER}",
                field="network", rule="GYM-10")
        return net.name

    def _joins_bridges(self) -> bool:
        """True iff the container joins a bridge of harbor_gym's (public, proxy; compose members: their group's)."""
        return self.spec.network or self.spec.host_service_port is not None

    def _guarded(self) -> bool:
        """True iff the host filter and spoofing guard are installed (else the network runs unfiltered, allowed)."""
        return _podman_net.public_network(self.client).filtered  # Docker's, or podman's own (never Docker's there)

    def _host_route(self) -> str:
        """The network through which the spec's ``host_service_port`` is reached (GYM-10): refused unless the host
        filter is installed (never unfiltered) and a route to the port is open. Sets `host_service_address`.

        Returns:
            the proxy network's name (joined only by a spec without a network).
        """
        from harbor_gym.sandbox import host_route

        port = self.spec.host_service_port
        net = _netfilter.public_network(self.client) if self.spec.network else _netfilter.proxy_network(self.client)
        iface = _netfilter.BRIDGE_IFACE if self.spec.network else _netfilter.PROXY_IFACE
        if not net.filtered or not net.gateway:
            raise SandboxUnavailableError(
                f"sandbox {self.name}: host_service_port={port} needs the host filter, which cannot be installed "
                f"here ({net.unfiltered_reason or 'the network has no gateway'})", field="host_service_port",
                rule="GYM-10")
        host_route.require_route("docker", port, iface, sandbox=self.name)
        self._host_service_address = f"{net.gateway.split('/')[0]}:{port}"
        return _netfilter.proxy_network(self.client).name

    @property
    def host_service_address(self) -> str | None:
        """``"IP:PORT"`` of the spec's ``host_service_port`` inside the sandbox (its bridge's gateway), once
        started; ``None`` when the spec names no port."""
        if self._state is not SandboxState.RUNNING:
            return None
        return self._host_service_address

    def _release_network(self) -> None:
        """Remove the spoofing guard's bindings of the removed container (never raises)."""
        bindings, self._bindings = self._bindings, []
        _netfilter.unbind_all(bindings)

    def _create(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        """Create the container; an image removed since it was inspected (gc) is resolved once more."""
        import docker.errors

        try:
            return self._create_once(api, labels, host_config)
        except docker.errors.ImageNotFound:
            images.forget(self.client, self._image.ref)
            self._image = images.ensure_image(self.client, self.spec, self.settings)
            return self._create_once(api, labels, host_config)
        except docker.errors.NotFound as exc:
            if _netfilter.PROXY_NETWORK in str(exc) and self.spec.host_service_port is not None:
                _netfilter.forget(self.client)  # removed meanwhile (gc while unused): create it again, once
                _netfilter.proxy_network(self.client)
                return self._create_once(api, labels, host_config)
            if not self.spec.network or not any(n in str(exc) for n in (_netfilter.PUBLIC_NETWORK,
                                                                        _podman_net.PUBLIC_NETWORK)):
                raise
            # the shared network was removed meanwhile (gc while unused): create it again, once
            _netfilter.forget(self.client)
            _podman_net.forget(self.client)
            _podman_net.public_network(self.client)
            return self._create_once(api, labels, host_config)

    def _create_once(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        spec = self.spec
        self._count()
        return api.create_container(
            self._image.id,
            command=leases.idle_command(),
            entrypoint=[],
            name=self.name,
            hostname=self.name[:63],
            labels=labels,
            environment=dict(spec.env),
            # the engine creates a missing working_dir at create: only when the spec asks for that
            working_dir=spec.workdir if spec.create_workdir else None,
            user=spec.user,
            host_config=api.create_host_config(**host_config),
        )
