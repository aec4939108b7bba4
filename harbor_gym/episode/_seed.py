"""Seeding and sandbox lifetime of an `Episode` (GYM-2, BUD-6/7, COMPOSE-1, LOAD-24, GYM-10, STOP-10)."""

from __future__ import annotations

import logging
from typing import Any

from harbor_gym.agents import agent_timeout_cap
from harbor_gym.episode._budgets import episode_deadline, task_step_budgets
from harbor_gym.episode._seedplan import SeedPlan, seed_plan
from harbor_gym.episode._spec import verifier_spec
from harbor_gym.episode._stop import TurnFault
from harbor_gym.errors import (
    HarborGymError,
    ImageError,
    SandboxError,
    SandboxUnavailableError,
    SeedError,
    SeedRefusedError,
)
from harbor_gym.sandbox._engine import engine_scope
from harbor_gym.sandbox.base import Sandbox, SandboxSettings, SandboxSpec

__all__: list[str] = []

#: Turn faults after which a full disk is the likely cause worth checking (GYM-10).
_STORAGE_SUSPECT = frozenset({TurnFault.OUTAGE, TurnFault.MASKED, TurnFault.NO_REWARD, TurnFault.PREP_FAILED})

_log = logging.getLogger("harbor_gym.episode")


class _SeedPhase:
    """Mixin of `Episode`: the deadline, starting and seeding the agent sandbox (with retries), sidecars,
    stopping every sandbox."""

    def _backend_name(self) -> str:
        name = self.config.backend.value
        if name != "auto":
            return name
        if self._engines is not None:  # issue 17: EnvConfig.engines are Docker engines
            return "docker"
        from harbor_gym.sandbox.pool import PoolFactory

        if isinstance(self._factory, PoolFactory):  # its backend was resolved when it was made
            return self._factory.backend
        if self._custom_factory:
            return "docker"
        try:
            from harbor_gym.sandbox._engine import engine_answers

            return "docker" if engine_answers() is None else "local"
        except Exception:  # no SDK or engine: the local provider would run it
            return "local"

    def _deadline(self) -> float | None:
        steps = task_step_budgets(self.task, self._modes, multiplier=self._multiplier,
                                  step_setup_timeout_s=self.config.step_setup_timeout_s,
                                  agent_cap=agent_timeout_cap(self.agent))
        return episode_deadline(
            steps, enforce=self.config.enforce_task_timeouts,
            harness_setup_allowance_s=self.config.harness_setup_allowance_s,
            verifier_grace_s=self.config.verifier_grace_s,
            default_episode_timeout_s=self.config.default_episode_timeout_seconds, harbor=self._harbor)

    def _seed_with_retries(self, spec: SandboxSpec) -> None:
        # pure: reads environment/ once, before any sandbox (FMT-10)
        plan = seed_plan(self.task, workdir_must_exist=not spec.create_workdir)
        attempts = self.config.seed_retries + 1
        last: HarborGymError | None = None
        for attempt in range(attempts):
            try:
                self._place()
                with engine_scope(self._engine.client if self._engine is not None else None):
                    self._seed_once(spec, plan)
                return
            except SandboxUnavailableError as exc:
                self._stop_sandboxes()
                exc = self._engine_out(exc)
                if exc.retryable:  # the engine does not answer: an outage, retried (GYM-2), never a refusal
                    last = exc
                    _log.warning("no engine answers while seeding %s (attempt %d/%d): %s", self.task.id,
                                 attempt + 1, attempts, exc)
                    continue
                raise SeedRefusedError(f"no provider here can run this task: {exc}", path=self.task.path,
                                       field="environment", rule="LOAD-24") from exc
            except ImageError as exc:
                self._stop_sandboxes()
                exc = self._engine_out(exc)
                if exc.retryable:  # the engine failed while resolving the image: an outage (GYM-2)
                    last = exc
                    _log.warning("image outage while seeding %s (attempt %d/%d): %s", self.task.id, attempt + 1,
                                 attempts, exc)
                    continue
                raise SeedError(f"the task's image cannot be had: {exc}", path=self.task.path, field="environment",
                                rule="GYM-2", retryable=False) from exc
            except SandboxError as exc:
                self._stop_sandboxes()
                last = self._engine_out(exc)
                _log.warning("sandbox outage while seeding %s (attempt %d/%d): %s", self.task.id, attempt + 1,
                             attempts, exc)
        raise SeedError(f"sandbox outage while seeding, {attempts} attempt(s): {last}", path=self.task.path,
                        rule="GYM-2", retryable=True) from last

    def _place(self) -> None:
        """Issue 17: place the episode on an engine of `EnvConfig.engines` (least in-flight first) unless it holds
        one. Raises `SandboxUnavailableError` (retryable) when every engine is out, naming each one's cause."""
        if self._engines is not None and self._engine is None:
            self._engine = self._engines.acquire()

    def _engine_out(self, exc: Any) -> Any:
        """After a failed seeding attempt on a placed engine: give the engine back, and if it stopped answering,
        take it out and return ``exc``'s kind of error (retryable) naming the engine; else ``exc``."""
        engine = self._engine
        if engine is None or self._engines is None:
            return exc
        self._release_engine()
        down = self._engines.check(engine)
        if down is None:
            return exc
        reason = getattr(exc, "reason", str(exc))
        if isinstance(exc, (SandboxUnavailableError, ImageError)):
            return type(exc)(f"{down}: {reason}", field="EnvConfig.engines", retryable=True)
        return SandboxError(f"{down}: {reason}", retryable=True)

    def _release_engine(self) -> None:
        """Give the episode's engine back to the set (idempotent)."""
        if self._engine is not None and self._engines is not None:
            self._engines.release(self._engine)
        self._engine = None

    def _main_from_factory(self) -> bool:
        """True iff the agent sandbox comes from the sandbox factory (False: service ``main`` of a compose group)."""
        compose = getattr(self.task, "compose", None)
        return compose is None or bool(self.task.config.environment.docker_image) or self.task.dockerfile is not None

    def _open_main(self, spec: SandboxSpec) -> Sandbox:
        """The agent sandbox: the factory's, or service ``main`` of the compose group (COMPOSE-1)."""
        compose = getattr(self.task, "compose", None)
        if self._main_from_factory():
            return self._factory(spec)
        from harbor_gym.sandbox.compose import open_group

        group = open_group(compose, backend=self._backend_name(), settings=SandboxSettings.from_config(self.config),
                           main_spec=spec, network=spec.network, labels=dict(spec.labels), name_hint=self.task.id,
                           build_timeout_s=spec.build_timeout_s, sidecar_storage_mb=self.config.default_storage_mb)
        self._group = group
        return group.main

    def _sidecar(self, name: str) -> Sandbox | None:
        """COMPOSE-1: a running sidecar by service name, or ``None``."""
        if self._group is None:
            return None
        try:
            return self._group.service(name)
        except (KeyError, HarborGymError):
            return None

    def _engine_refusals(self, spec: SandboxSpec) -> None:
        """GYM-10 on Docker, before any sandbox of this attempt starts: a bounded storage size needs an engine whose
        storage driver bounds it, and a public network needs the host filter (`EnvConfig.unfiltered_network`:
        ``"refuse"`` refuses, ``"allow"`` runs with a warning naming what stays reachable). Covers the agent
        sandbox, service ``main``, sidecars (the default storage bound) and every separate verifier sandbox.

        Raises:
            SeedRefusedError: naming why and what the engine needs (never retried).
            SandboxUnavailableError: the engine does not answer (an outage: the caller retries).
        """
        backend = self._backend_name()
        if backend not in ("docker", "podman"):
            return
        from harbor_gym.sandbox import engine_client
        specs = [spec]
        for step, mode in zip(self.task.steps, self._modes):
            if mode == "separate":
                specs.append(verifier_spec(self.task, step, agent=spec,
                                           default_storage_mb=self.config.default_storage_mb,
                                           default_memory_mb=self.config.default_memory_mb,
                                           host_env_allowlist=self.config.host_env_allowlist)[0])
        if backend == "podman":
            self._podman_limit_refusals(specs, engine_client(backend))
        sized = [s for s in specs if s.storage_mb is not None]
        if sized or (getattr(self.task, "compose", None) is not None and self.config.default_storage_mb is not None):
            from harbor_gym.sandbox._engine import storage_support

            support = storage_support(engine_client(backend))
            if not support.supported:
                field = "environment.storage_mb" if self.task.config.environment.storage_mb is not None else \
                    "EnvConfig.default_storage_mb"
                raise SeedRefusedError(
                    f"the sandbox's writable size ({(sized[0].storage_mb if sized else self.config.default_storage_mb)}"
                    f" MiB) cannot be bounded on this engine: {support.reason}. Give the engine such a data root "
                    "(scripts/setup-host.sh does), or lift the bound with EnvConfig(default_storage_mb=None) for a "
                    "task that sets no storage_mb", path=self.task.path / "task.toml", field=field, rule="GYM-10")
        if any(s.network for s in specs) or not self._main_from_factory():  # a group's bridge needs the filter too
            from harbor_gym.sandbox._netfilter import REACHABLE_WITHOUT_FILTER
            from harbor_gym.sandbox._podman_net import public_network

            net = public_network(engine_client(backend))
            if not net.filtered:
                if self.config.unfiltered_network == "refuse":
                    raise SeedRefusedError(
                        f"the task's network is public (or a compose group's) but harbor_gym cannot filter it from "
                        f"the host here ({net.unfiltered_reason}), so its sandbox would reach {REACHABLE_WITHOUT_FILTER}; run as "
                        "root on the engine's host, set network_mode = 'no-network', or accept it with "
                        "EnvConfig(unfiltered_network='allow')", path=self.task.path / "task.toml",
                        field="environment.network_mode", rule="GYM-10")
                _log.warning("%s: public network unfiltered (%s); its sandbox reaches %s", self.task.id,
                             net.unfiltered_reason, REACHABLE_WITHOUT_FILTER)

    def _podman_limit_refusals(self, specs: list[SandboxSpec], client: Any) -> None:
        """LOAD-24 on podman, before any sandbox starts: a ``cpus`` or ``memory_mb`` (the task's, the default memory
        bound, a compose service's size) that the engine cannot apply (rootless podman on cgroup v1) is refused,
        naming the field and the fix; ``pids_limit`` is not applied there (logged once, README "Podman")."""
        from harbor_gym.sandbox import _podman

        engine = _podman.engine_of(client)
        if engine is None:
            return
        env = self.task.config.environment
        compose = getattr(self.task, "compose", None)
        sizes = [s.size() for s in compose.services] if compose is not None else []
        wanted = {"cpus": any(s.cpus is not None for s in specs) or any(z.cpus is not None for z in sizes),
                  "memory_mb": any(s.memory_mb is not None for s in specs)
                  or any(z.memory_bytes is not None for z in sizes)}
        for field, asked in wanted.items():
            if not asked or engine.can_limit(field):
                continue
            if field == "memory_mb" and env.memory_mb is None and self.config.default_memory_mb is not None:
                where, fix = "EnvConfig.default_memory_mb", "lift the default with EnvConfig(default_memory_mb=None)"
            else:
                where, fix = f"environment.{field}", "run it on rootful podman, Docker or a cgroup v2 host"
            raise SeedRefusedError(
                f"{field} cannot be applied on {engine.describe()} (it has no "
                f"'{_podman.LIMIT_CONTROLLERS[field]}' cgroup controller for its containers); {fix}",
                path=self.task.path / "task.toml", field=where, rule="LOAD-24")
        for s in specs:
            _podman.warn_unapplied(s, engine)

    def _seed_once(self, spec: SandboxSpec, plan: SeedPlan) -> None:
        """Start and seed the agent sandbox (GYM-2). A factory with ``claim_prepared`` (a warm pool) hands out one
        on which ``plan`` already ran, off the reset path; a failed preparation is never handed out and raises here
        as it would have on the reset path (the pool's cold claim runs ``plan.apply`` itself). Otherwise the
        sandbox is started, then ``plan`` is applied to it here. GYM-10's engine refusals come first."""
        self._engine_refusals(spec)
        claim_prepared = getattr(self._factory, "claim_prepared", None)
        if claim_prepared is not None and self._main_from_factory():
            sb = claim_prepared(spec, plan.key, plan.apply)
            self._sandbox = sb
            self._user_in_place = sb.default_user
            return
        sb = self._open_main(spec)
        self._sandbox = sb
        self._user_in_place = sb.default_user
        plan.apply(sb)

    def _storage_fault(self, t: Any, fault: TurnFault) -> TurnFault:
        """GYM-10: a turn that failed (outage, masked, no reward file, failed preparation) while the agent
        sandbox's writable size is at its bound ends as `TurnFault.STORAGE` (``harbor_gym:storage_exceeded``),
        its cause saying "storage"; any other turn keeps ``fault``. Asks the sandbox's engine-side measure
        (``storage_exceeded()``) only then, so a successful turn pays nothing."""
        if fault not in _STORAGE_SUSPECT or getattr(t, "engine_error", False):
            return fault
        check = getattr(self._sandbox, "storage_exceeded", None)
        if check is None:
            return fault
        try:
            exceeded = bool(check())
        except Exception as exc:  # the measure failing leaves the turn as it was
            _log.debug("storage check of %s failed: %s", self.task.id, exc)
            return fault
        if not exceeded:
            return fault
        bound = getattr(getattr(self._sandbox, "spec", None), "storage_mb", None)
        t.cause = (f"storage exceeded: the sandbox's writable size reached its bound of {bound} MiB"
                   if bound else "storage exceeded: the sandbox's writable size reached its bound")
        return TurnFault.STORAGE

    def _stop_sandboxes(self) -> None:
        first: BaseException | None = None
        for sb in [*self._others, self._sandbox, self._group]:
            if sb is None:
                continue
            try:
                sb.stop()
            except Exception as exc:  # close every part, then report the first failure
                first = first or exc
        self._others.clear()
        self._sandbox = None
        self._group = None
        if first is not None:
            _log.warning("stopping a sandbox failed: %s", first)
