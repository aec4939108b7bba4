"""Seeding and sandbox lifetime of an `Episode` (GYM-2, BUD-6/7, COMPOSE-1, LOAD-24, STOP-10)."""

from __future__ import annotations

import logging

from harbor_gym.agents import agent_timeout_cap
from harbor_gym.episode._budgets import episode_deadline, task_step_budgets
from harbor_gym.episode._seedplan import SeedPlan, seed_plan
from harbor_gym.errors import (
    HarborGymError,
    ImageError,
    SandboxError,
    SandboxUnavailableError,
    SeedError,
    SeedRefusedError,
)
from harbor_gym.sandbox.base import Sandbox, SandboxSettings, SandboxSpec

__all__: list[str] = []

_log = logging.getLogger("harbor_gym.episode")


class _SeedPhase:
    """Mixin of `Episode`: the deadline, starting and seeding the agent sandbox (with retries), sidecars,
    stopping every sandbox."""

    def _backend_name(self) -> str:
        name = self.config.backend.value
        if name != "auto":
            return name
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
        plan = seed_plan(self.task)  # pure: reads environment/ once, before any sandbox (FMT-10)
        attempts = self.config.seed_retries + 1
        last: HarborGymError | None = None
        for attempt in range(attempts):
            try:
                self._seed_once(spec, plan)
                return
            except SandboxUnavailableError as exc:
                self._stop_sandboxes()
                if exc.retryable:  # the engine does not answer: an outage, retried (GYM-2), never a refusal
                    last = exc
                    _log.warning("no engine answers while seeding %s (attempt %d/%d): %s", self.task.id,
                                 attempt + 1, attempts, exc)
                    continue
                raise SeedRefusedError(f"no provider here can run this task: {exc}", path=self.task.path,
                                       field="environment", rule="LOAD-24") from exc
            except ImageError as exc:
                self._stop_sandboxes()
                if exc.retryable:  # the engine failed while resolving the image: an outage (GYM-2)
                    last = exc
                    _log.warning("image outage while seeding %s (attempt %d/%d): %s", self.task.id, attempt + 1,
                                 attempts, exc)
                    continue
                raise SeedError(f"the task's image cannot be had: {exc}", path=self.task.path, field="environment",
                                rule="GYM-2", retryable=False) from exc
            except SandboxError as exc:
                self._stop_sandboxes()
                last = exc
                _log.warning("sandbox outage while seeding %s (attempt %d/%d): %s", self.task.id, attempt + 1,
                             attempts, exc)
        raise SeedError(f"sandbox outage while seeding, {attempts} attempt(s): {last}", path=self.task.path,
                        rule="GYM-2", retryable=True) from last

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
                           build_timeout_s=spec.build_timeout_s)
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

    def _seed_once(self, spec: SandboxSpec, plan: SeedPlan) -> None:
        """Start and seed the agent sandbox (GYM-2). A factory with ``claim_prepared`` (a warm pool) hands out one
        on which ``plan`` already ran, off the reset path; a failed preparation is never handed out and raises here
        as it would have on the reset path (the pool's cold claim runs ``plan.apply`` itself). Otherwise the
        sandbox is started, then ``plan`` is applied to it here."""
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
