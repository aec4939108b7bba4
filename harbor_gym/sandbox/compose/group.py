"""`ComposeGroup`: the services of a compose file as `Sandbox` objects on a private network (SPEC
COMPOSE-1..3).

Start: one labelled, ``internal`` bridge network of the group (services reach each other by name, nothing reaches
out through it; with the task's network on, service ``main`` also joins the shared, host-filtered public network
for egress, GYM-10; without it, when ``main_spec`` names a ``host_service_port``, ``main`` joins the proxy network
that reaches only that host port, `harbor_gym.sandbox.host_route`), the declared named volumes (labelled), then every service in
``depends_on`` order, each a `ServiceSandbox` (a `DockerSandbox`), waiting for ``condition: service_healthy``
through the engine's healthcheck status before starting a dependent. ``main`` is the agent's sandbox; its spec
(workdir, env, user, sizes) may come from the caller (`main_spec`). Sidecar sizes follow COMPOSE-2; sidecar
commands never see ``main``'s workdir, user or env (COMPOSE-3: each service runs with its own).

Stop removes the containers (reverse order), then the network, then the volumes; it is idempotent, runs on any
failure during start (Ctrl-C included) and at interpreter exit. Every resource carries the managed label, the
run label, the lease label and the lease TTL, so the engine's reaper (`harbor_gym.sandbox._reaper`) removes what
a crashed host left within the lease bound, and ``harbor-gym gc`` too.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from harbor_gym.errors import SandboxError, SandboxUnavailableError
from harbor_gym.sandbox import _reaper, lease as leases
from harbor_gym.sandbox import _netfilter, _podman, _podman_net
from harbor_gym.sandbox._engine import get_client, scoped_client, translate_error
from harbor_gym.sandbox.base import (
    MANAGED_LABEL,
    RUN_LABEL,
    Sandbox,
    SandboxSettings,
    SandboxSpec,
    SandboxState,
)
from harbor_gym.sandbox.compose._service import GROUP_LABEL, SERVICE_LABEL, ServiceSandbox
from harbor_gym.sandbox.docker_backend import TTL_LABEL

if TYPE_CHECKING:
    import docker

    from harbor_gym.task.compose import ComposeFile, ComposeService

__all__ = ["ComposeGroup", "DEFAULT_START_TIMEOUT_S"]

log = logging.getLogger("harbor_gym.sandbox")

#: Bound of waiting for one service's ``service_healthy`` condition.
DEFAULT_START_TIMEOUT_S = 300.0
#: How long removal of the network and volumes is retried while the engine still tears containers down.
_TEARDOWN_S = 15.0
_POLL_S = 0.2
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]+")


class ComposeGroup:
    """The running services of one compose file (use as a context manager).

    Args:
        compose: the parsed compose file (``Task.compose``).
        settings: host settings (aliases, pull policy, lease TTL, output cap).
        main_spec: the agent sandbox's spec from the episode (workdir, env, user, cpus, memory_mb, pids_limit,
            storage_mb, tmpfs, labels); its ``image``/``build_context`` are replaced by service ``main``'s.
            Unset fields fall back to the compose file's (env: the compose env with the spec's laid over it;
            pids_limit: the tighter of the spec's and the compose file's). ``None``: everything from the compose
            file.
        network: ``True`` gives service ``main`` a route out through the shared public network
            (`harbor_gym.sandbox._netfilter`: no host service, no other sandbox); the group's own network is
            internal either way, and the services reach each other by name on it. Sidecars get no route out:
            on the shared network the engine's DNS would answer a service name with an address there, where
            inter-container traffic is off.
        sidecar_storage_mb: the writable size bound of each sidecar (`EnvConfig.default_storage_mb`, GYM-10);
            ``None``: unbounded. Service ``main`` takes ``main_spec``'s.
        labels: extra labels on every resource.
        name_hint: readable part of the resource names (e.g. the task id).
        build_timeout_s: bound of each service's image build.
        start_timeout_s: bound of waiting for one ``service_healthy`` condition.

    Attributes:
        name: the group's name (its network's), ``hg-<hint>-<random>``.
        services: service name -> running `Sandbox` (after start).
    """

    backend = "docker"

    def __init__(
        self,
        compose: "ComposeFile",
        *,
        settings: SandboxSettings | None = None,
        main_spec: SandboxSpec | None = None,
        network: bool = False,
        labels: Mapping[str, str] | None = None,
        name_hint: str = "group",
        build_timeout_s: float = 600.0,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        sidecar_storage_mb: int | None = None,
        client: "docker.DockerClient | None" = None,
        lease: leases.Lease | None = None,
    ) -> None:
        self.compose = compose
        self.settings = settings or SandboxSettings()
        self.main_spec = main_spec
        self.network_enabled = network
        self.labels = dict(labels or {})
        hint = _NAME_BAD.sub("-", name_hint).strip("-._")[:30] or "group"
        self.name = f"hg-{hint}-{secrets.token_hex(3)}"
        self.build_timeout_s = build_timeout_s
        self.start_timeout_s = start_timeout_s
        self.sidecar_storage_mb = sidecar_storage_mb
        self._client = client if client is not None else scoped_client()  # the episode's engine, if any
        self._lease = lease
        self._state = SandboxState.CREATED
        self._members: dict[str, ServiceSandbox] = {}
        self._network_id: str | None = None
        self._volumes: dict[str, str] = {}
        self._lock = threading.Lock()

    # --- accessors ------------------------------------------------------------------------------------------
    @property
    def state(self) -> SandboxState:
        return self._state

    @property
    def client(self) -> "docker.DockerClient":
        if self._client is None:
            self._client = get_client()
        return self._client

    @property
    def services(self) -> dict[str, Sandbox]:
        """Service name -> its running sandbox (a copy)."""
        return dict(self._members)

    @property
    def main(self) -> Sandbox:
        """Service ``main``: the agent's sandbox (COMPOSE-1)."""
        return self.service("main")

    def service(self, name: str) -> Sandbox:
        """The sandbox of service ``name`` (for sidecar collect hooks and artifacts, ART-1/3).

        Raises:
            SandboxError: the group is not running or has no such service.
        """
        if self._state is not SandboxState.RUNNING:
            raise SandboxError(f"group {self.name} is not running (state {self._state.value})")
        try:
            return self._members[name]
        except KeyError:
            raise SandboxError(f"group {self.name} has no service {name!r} (services: {list(self._members)})",
                               path=self.compose.path, field="service") from None

    def is_alive(self) -> bool:
        """True iff the group is running and every service's container runs."""
        return self._state is SandboxState.RUNNING and all(m.is_alive() for m in self._members.values())

    def __repr__(self) -> str:
        return f"ComposeGroup(name={self.name!r}, services={list(self._members)}, state={self._state.value})"

    def __enter__(self) -> "ComposeGroup":
        if self._state is SandboxState.CREATED:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- start ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the network and volumes, then start every service in dependency order.

        Raises:
            ImageError: a service's image cannot be found or built.
            SandboxUnavailableError: no engine, or a size the engine cannot enforce (LOAD-24).
            SandboxError: the engine refused a resource, a service died during start, or a ``service_healthy``
                condition failed (unhealthy, no healthcheck, or not healthy within ``start_timeout_s``).
        After a raise (Ctrl-C included) nothing of the group is left.
        """
        if self._state is not SandboxState.CREATED:
            raise SandboxError(f"group {self.name} was already started (state {self._state.value})")
        leases.register(self)
        try:
            self._start()
            with self._lock:
                self._check_not_stopped()
                self._state = SandboxState.RUNNING
        except BaseException:
            self.stop()
            self._sweep()
            raise

    def _resource_labels(self, lease: leases.Lease) -> dict[str, str]:
        return {**dict(self.settings.labels), **self.labels, MANAGED_LABEL: "true", RUN_LABEL: lease.run_id,
                TTL_LABEL: f"{self.settings.lease_ttl_s:g}", GROUP_LABEL: self.name,
                **_reaper.lease_labels(lease.run_id)}

    def _start(self) -> None:
        lease = self._lease or leases.process_lease()
        lease.want_ttl(self.settings.lease_ttl_s)
        _reaper.attach(lease, self.client, self.settings)  # GYM-10: before any labelled resource exists
        labels = self._resource_labels(lease)
        api = self.client.api
        # GYM-10: the host rules that keep every group bridge (hgg-+) and the public one off the host
        net = _podman_net.public_network(self.client)  # Docker's (`_netfilter`), or podman's own
        if not net.filtered and getattr(self.settings, "unfiltered_network", "refuse") != "allow":
            raise SandboxUnavailableError(
                f"group {self.name}: its network cannot be filtered from the host here ({net.unfiltered_reason}); "
                f"its services would reach {_netfilter.REACHABLE_WITHOUT_FILTER}", field="network", rule="GYM-10")
        try:
            self._network_id = api.create_network(
                self.name, driver="bridge", internal=True, labels=labels,
                options={"com.docker.network.bridge.name": _podman_net.group_bridge_name(self.client)},
                check_duplicate=True)["Id"]
            for volume in self.compose.volumes:
                docker_name = f"{self.name}_{volume}"
                api.create_volume(docker_name, labels=labels)
                self._volumes[volume] = docker_name
        except Exception as exc:
            translate_error(exc, what="create the group's network and volumes", sandbox=self.name)
        healthy: set[str] = set()
        for service in self.compose.start_order():
            self._check_not_stopped()
            for dep, condition in service.depends_on:
                if condition == "service_healthy" and dep not in healthy:
                    self._wait_healthy(self._members[dep])
                    healthy.add(dep)
                elif not self._members[dep].is_alive():
                    raise self._died(self._members[dep],
                                     f"before {service.name!r} (which depends on it) started")
            member = self._member(service, lease, labels)
            self._members[service.name] = member
            member.start()
            self._check_not_stopped()
            log.debug("group %s: service %s started (%s)", self.name, service.name, member.name)

    def _check_not_stopped(self) -> None:
        """A concurrent `stop` (another thread closing the env) ends the start; what was made is removed."""
        if self._state is SandboxState.STOPPED:
            raise SandboxError(f"group {self.name} was stopped while starting", retryable=True)

    def _member(self, service: "ComposeService", lease: leases.Lease,
                labels: dict[str, str]) -> ServiceSandbox:
        size = service.size()
        image = {"image": service.image} if service.build is None else {
            "build_context": service.build.context, "dockerfile": service.build.dockerfile}
        member_labels = {**labels, SERVICE_LABEL: service.name}
        hint = f"{self.name[3:]}-{service.name}"
        memory_bytes = size.memory_bytes
        if service.is_main and self.main_spec is not None:
            given = self.main_spec
            spec = dataclasses.replace(
                given, image=image.get("image"), build_context=image.get("build_context"),
                dockerfile=image.get("dockerfile", "Dockerfile"), build_timeout_s=self.build_timeout_s,
                workdir=given.workdir or service.working_dir, env={**service.env, **given.env},
                user=given.user or service.user,
                cpus=given.cpus if given.cpus is not None else size.cpus,
                pids_limit=min((p for p in (given.pids_limit, size.pids) if p is not None), default=None),
                network=self.network_enabled, labels={**given.labels, **member_labels}, name_hint=hint)
            if given.memory_mb is not None:
                memory_bytes = None  # the spec's memory_mb applies
        else:
            spec = SandboxSpec(
                **image, build_timeout_s=self.build_timeout_s, workdir=service.working_dir, env=service.env,
                user=service.user, cpus=size.cpus, pids_limit=size.pids,
                network=self.network_enabled and service.is_main, build_network=self.network_enabled,
                storage_mb=self.sidecar_storage_mb, labels=member_labels, name_hint=hint)
        return ServiceSandbox(spec, self.settings, service=service, network=self.name, volumes=self._volumes,
                              memory_bytes=memory_bytes, follow_service=not service.is_main,
                              client=self._client, lease=lease)

    def _died(self, member: ServiceSandbox, when: str) -> SandboxError:
        return SandboxError(f"group {self.name}: service {member.service.name!r} exited {when}"
                            f"{self._logs_tail(member)}", path=self.compose.path,
                            field=f"services.{member.service.name}", rule="COMPOSE-1", retryable=True)

    def _logs_tail(self, member: ServiceSandbox) -> str:
        try:
            raw = self.client.api.logs(member.container_id or member.name, tail=20)
            text = raw.decode("utf-8", "replace")
        except Exception:  # the container may be gone already; the message stays useful without its logs
            return ""
        return f"\n--- last lines of its output ---\n{text.rstrip()}" if text.strip() else ""

    def _wait_healthy(self, member: ServiceSandbox) -> None:
        """Block until ``member``'s engine healthcheck reports healthy (compose's ``service_healthy``)."""
        name = member.service.name
        where = f"services.{name}.healthcheck"
        deadline = time.monotonic() + self.start_timeout_s
        check = member.service.healthcheck
        drive = _podman.healthcheck_driver(self.client, member.container_id,
                                           check.interval_s if check is not None else 1.0)  # None on Docker
        while True:
            if drive is not None:
                drive()
            try:
                attrs = self.client.api.inspect_container(member.container_id)
            except Exception as exc:
                translate_error(exc, what=f"wait for service {name!r} to be healthy", sandbox=member.name)
            state = attrs.get("State") or {}
            health = state.get("Health")
            if not state.get("Running"):
                raise self._died(member, f"(code {state.get('ExitCode')}) before it became healthy")
            if health is None:
                raise SandboxError(f"group {self.name}: a service waits for {name!r} to be healthy, but it "
                                   "has no healthcheck (neither in the compose file nor in its image)",
                                   path=self.compose.path, field=where, rule="COMPOSE-1")
            status = health.get("Status")
            if status == "healthy":
                return
            if status == "unhealthy":
                last = (health.get("Log") or [{}])[-1]
                raise SandboxError(f"group {self.name}: service {name!r} is unhealthy; last check exited "
                                   f"{last.get('ExitCode')}: {str(last.get('Output', '')).strip()[-500:]}",
                                   path=self.compose.path, field=where, rule="COMPOSE-1", retryable=True)
            if time.monotonic() >= deadline:
                raise SandboxError(f"group {self.name}: service {name!r} was not healthy within "
                                   f"{self.start_timeout_s:g} s", path=self.compose.path, field=where,
                                   rule="COMPOSE-1", retryable=True)
            time.sleep(_POLL_S)

    # --- stop -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove every container (reverse start order), then the network, then the volumes. Idempotent; never
        raises (what it cannot remove is logged and left to ``harbor-gym gc``)."""
        with self._lock:  # one stop at a time; a later call removes what a racing start made since
            self._state = SandboxState.STOPPED
            try:
                for member in reversed(list(self._members.values())):
                    try:
                        member.stop()  # idempotent
                    except Exception as exc:  # keep removing the rest; gc removes what this misses
                        log.warning("group %s: stopping %s failed: %s", self.name, member.name, exc)
                network_id, self._network_id = self._network_id, None
                if network_id is not None:
                    self._remove(lambda: self.client.api.remove_network(network_id), f"network {self.name}")
                while self._volumes:
                    _, docker_name = self._volumes.popitem()
                    self._remove(lambda n=docker_name: self.client.api.remove_volume(n, force=True),
                                 f"volume {docker_name}")
            finally:
                leases.unregister(self)

    def _sweep(self) -> None:
        """After a failed or interrupted start: remove whatever still carries the group's label (a container a
        racing member start created after its stop, and the network and volumes then). Never raises."""
        selector = {"label": f"{GROUP_LABEL}={self.name}"}
        api = self.client.api
        try:
            for container in api.containers(all=True, filters=selector):
                self._remove(lambda cid=container["Id"]: api.remove_container(cid, force=True),
                             f"container {container['Id'][:12]}")
            for net in api.networks(filters=selector):
                self._remove(lambda nid=net["Id"]: api.remove_network(nid), f"network {net['Name']}")
            for vol in (api.volumes(filters=selector) or {}).get("Volumes") or []:
                self._remove(lambda n=vol["Name"]: api.remove_volume(n, force=True), f"volume {vol['Name']}")
        except Exception as exc:  # engine gone: gc removes the rest by lease
            log.warning("group %s: sweeping after a failed start failed: %s", self.name, exc)

    def _remove(self, remove: Any, what: str) -> None:
        """Call ``remove`` until it succeeds or the thing is gone; retried while containers are still being
        torn down (the engine refuses with "in use" / "active endpoints" until then)."""
        import docker.errors

        deadline = time.monotonic() + _TEARDOWN_S
        while True:
            try:
                remove()
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if time.monotonic() >= deadline:
                    log.warning("group %s: removing %s failed: %s (harbor-gym gc removes it)", self.name,
                                what, exc)
                    return
            except Exception as exc:  # engine gone: gc removes it later
                log.warning("group %s: removing %s failed: %s (harbor-gym gc removes it)", self.name, what,
                            exc)
                return
            time.sleep(_POLL_S)
