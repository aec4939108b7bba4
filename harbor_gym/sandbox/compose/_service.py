"""`ServiceSandbox`: one compose service as a `DockerSandbox` on its group's private network (private).

It is a `DockerSandbox` in every respect (exec, put, get, read_file, stop) except how its container is
created: attached to the group's network with the service name as its DNS alias, with the service's named
volumes and read-only binds mounted (uploaded instead on a remote engine, `_engine.is_remote`; ``main`` also on the public network, or on the proxy network when it may
reach a host service: `harbor_gym.sandbox.host_route`), its read-write binds copied in before start (a bind of a task-folder path
is never mounted writable, so no sandbox writes into the downloaded folder on the host: SPEC GYM-10), its memory
size in bytes, its compose healthcheck given to the engine, and its command run under `SERVICE_LOOP`.

Lease (SPEC GYM-10): like every Docker sandbox, a service container carries its run's lease label and the engine's
reaper (`harbor_gym.sandbox._reaper`) removes it once the lease is stale; nothing in the container takes part.
The container's main process (under the engine's init) is a POSIX-sh wrapper that starts the service's argv in
the background: a sidecar's wrapper exits with the service's status when the service exits (compose: the
container stops); ``main``'s keeps waiting, since the agent's sandbox must outlive whatever command it declares.
Sidecar containers are not auto-removed, so a service that dies during start can be diagnosed from its logs; the
group's ``stop`` removes them, and the reaper or ``harbor-gym gc`` what a crashed host left (their lease, run
and TTL labels). Needs ``sh``, ``sleep`` and ``kill`` in the image (coreutils or busybox).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harbor_gym.sandbox import archives
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox._engine import is_remote, translate_error
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.docker_backend import DockerSandbox

if TYPE_CHECKING:
    from harbor_gym.task.compose import ComposeService

__all__ = ["ServiceSandbox", "SERVICE_LOOP", "GROUP_LABEL", "SERVICE_LABEL", "service_command"]

#: The group (its network's name) a container, network or volume belongs to.
GROUP_LABEL = "io.harbor-gym.group"
#: The compose service a container runs.
SERVICE_LABEL = "io.harbor-gym.service"

# $1 follow (1: exit with the service's status when it exits), then the service's argv.
SERVICE_LOOP = r"""follow=$1; shift 1
"$@" &
svc=$!
trap 'kill -TERM "$svc" 2>/dev/null; exit 0' TERM INT HUP
if [ "$follow" = 1 ]; then wait "$svc"; exit $?; fi
while :; do sleep 3600 & wait $!; done"""


def service_command(service: "ComposeService", image_entrypoint: list[str] | None,
                    image_cmd: list[str] | None) -> list[str]:
    """The service's argv as compose computes it: ``entrypoint`` (which drops the image's CMD) plus
    ``command``; else the image's ENTRYPOINT plus ``command``, else plus the image's CMD."""
    if service.entrypoint is not None:
        return [*service.entrypoint, *(service.command or ())]
    tail = list(service.command) if service.command is not None else list(image_cmd or [])
    return [*(image_entrypoint or []), *tail]


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class ServiceSandbox(DockerSandbox):
    """A `DockerSandbox` running one compose service on a group's network (see the module docstring).

    Args:
        spec: image or build context, workdir, env, user, cpus, pids (memory comes from ``memory_bytes``).
        settings: host settings.
        service: the compose service.
        network: the group's network name.
        volumes: compose volume name -> Docker volume name of the group.
        memory_bytes: memory limit (and swap limit: no swap) in bytes; ``None`` = none, or the spec's.
        follow_service: exit when the service exits (sidecars); ``False`` for ``main``.
        group_labels: labels of the group (added to the spec's).
    """

    def __init__(
        self,
        spec: SandboxSpec,
        settings: SandboxSettings | None = None,
        *,
        service: "ComposeService",
        network: str,
        volumes: dict[str, str],
        memory_bytes: int | None = None,
        follow_service: bool,
        client: Any = None,
        lease: leases.Lease | None = None,
    ) -> None:
        super().__init__(spec, settings, client=client, lease=lease)
        self.service = service
        self.network = network
        self._volumes = volumes
        self._memory_bytes = memory_bytes
        self._follow = follow_service

    def __repr__(self) -> str:
        return f"ServiceSandbox(service={self.service.name!r}, name={self.name!r}, state={self.state.value})"

    def _create_once(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        service = self.service
        hc = dict(host_config)
        hc["network_mode"] = self.network
        if self._follow:
            hc["auto_remove"] = False
        binds = dict(hc.get("binds") or {})
        copies = []
        for mount in service.mounts:
            mode = "ro" if mount.read_only else "rw"
            if mount.kind == "volume":
                binds[self._volumes[mount.source]] = {"bind": mount.target, "mode": mode}
            elif mount.read_only and not is_remote(self.client):
                binds[mount.source] = {"bind": mount.target, "mode": "ro"}
            # a remote engine's host has no such path: the bind is uploaded like a writable one (issue 17)
            else:
                copies.append(mount)
        hc["binds"] = binds
        if self._memory_bytes is not None:
            hc["mem_limit"] = self._memory_bytes
            hc["memswap_limit"] = self._memory_bytes
        config = api.inspect_image(self._image.id).get("Config") or {}
        self._count()
        argv = service_command(service, config.get("Entrypoint"), config.get("Cmd"))
        if argv:
            command = ["/bin/sh", "-c", SERVICE_LOOP, "harbor-gym-service", "1" if self._follow else "0", *argv]
        elif self._follow:
            from harbor_gym.errors import SandboxError

            raise SandboxError(f"service {service.name!r} has no command: neither the compose file nor its "
                               "image names one", field=f"services.{service.name}.command", rule="COMPOSE-1")
        else:
            command = leases.idle_command()
        healthcheck = None
        if service.healthcheck is not None:
            check = service.healthcheck
            healthcheck = {"test": list(check.test)}
            if not check.disabled:
                healthcheck.update(interval=_ns(check.interval_s), timeout=_ns(check.timeout_s),
                                   retries=check.retries, start_period=_ns(check.start_period_s))
        self._count()
        created = api.create_container(
            self._image.id,
            command=command,
            entrypoint=[],
            name=self.name,
            hostname=service.name[:63],
            labels=labels,
            environment=dict(self.spec.env),
            # the compose file's own working_dir is created at create (as docker compose does); the task's
            # workdir only when the spec asks for that
            working_dir=self.spec.workdir if self.spec.create_workdir else (self.service.working_dir or None),
            user=self.spec.user,
            healthcheck=healthcheck,
            host_config=api.create_host_config(**hc),
            networking_config=api.create_networking_config(
                {self.network: api.create_endpoint_config(aliases=[service.name])}),
        )
        for mount in copies:
            self._copy_in(api, created["Id"], mount.source, mount.target)
        from harbor_gym.sandbox import _netfilter, _podman_net

        # GYM-10: egress only through the shared, host-filtered network; without a network, a host service's port
        # only through the proxy network (harbor_gym.sandbox.host_route)
        if self.spec.network or self.spec.host_service_port is not None:
            net = (_podman_net.public_network if self.spec.network else _netfilter.proxy_network)(self.client)
            try:
                api.connect_container_to_network(created["Id"], net.name)
                self._count()
            except Exception as exc:
                self._count()
                translate_error(exc, what=f"join the network {net.name}", sandbox=self.name)
        return created

    def _joins_bridges(self) -> bool:
        """Always: every service is on its group's bridge (bound by the spoofing guard, not isolated)."""
        return True

    def _copy_in(self, api: Any, container_id: str, source: str, target: str) -> None:
        """Place a host file or folder's contents at ``target`` in the created (not yet started) container."""
        from pathlib import Path

        data = archives.tar_local_path(Path(source), target, owner=None, mode=None)
        try:
            api.put_archive(container_id, "/", data)
            self._count()
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"copy {source} to {target}", sandbox=self.name)
