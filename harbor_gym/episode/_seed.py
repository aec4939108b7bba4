"""Seeding and sandbox lifetime of an `Episode` (GYM-2, BUD-6/7, COMPOSE-1, LOAD-24, STOP-10)."""

from __future__ import annotations

import logging

from harbor_gym.agents import agent_timeout_cap
from harbor_gym.episode._budgets import (
    StepBudgets,
    agent_budget,
    episode_deadline,
    healthcheck_worst_case,
    setup_bound,
    verifier_budget,
)
from harbor_gym.episode._healthcheck import poll_healthcheck
from harbor_gym.episode._shell import Script, parse
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._turnstate import _HOUSEKEEPING_S
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
        if self._custom_factory:
            return "docker"
        try:
            from harbor_gym.sandbox._engine import engine_answers

            return "docker" if engine_answers() is None else "local"
        except Exception:  # no SDK or engine: the local provider would run it
            return "local"

    def _deadline(self) -> float | None:
        steps = []
        for step, mode in zip(self.task.steps, self._modes):
            agent = agent_budget(step.agent_timeout_sec, None, self._multiplier, agent_timeout_cap(self.agent))
            hc = step.healthcheck
            table = step.verifier_environment or self.task.config.environment
            steps.append(StepBudgets(
                agent=agent,
                verifier=verifier_budget(step.verifier_timeout_sec, self._multiplier),
                setup=setup_bound(self.config.step_setup_timeout_s, agent),
                has_setup=step.setup_script is not None,
                healthcheck=None if hc is None else healthcheck_worst_case(
                    hc.start_period_sec, hc.start_interval_sec, hc.timeout_sec, hc.interval_sec, hc.retries),
                collect_timeouts=tuple(float(h.timeout_sec) for h in step.collect),
                separate=mode == "separate",
                sandbox_start_allowance=float(table.build_timeout_sec),
            ))
        return episode_deadline(
            steps, enforce=self.config.enforce_task_timeouts,
            harness_setup_allowance_s=self.config.harness_setup_allowance_s,
            verifier_grace_s=self.config.verifier_grace_s,
            default_episode_timeout_s=self.config.default_episode_timeout_seconds, harbor=self._harbor)

    def _seed_with_retries(self, spec: SandboxSpec) -> None:
        attempts = self.config.seed_retries + 1
        last: HarborGymError | None = None
        for attempt in range(attempts):
            try:
                self._seed_once(spec)
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

    def _open_main(self, spec: SandboxSpec) -> Sandbox:
        """The agent sandbox: the factory's, or service ``main`` of the compose group (COMPOSE-1)."""
        compose = getattr(self.task, "compose", None)
        if compose is None or self.task.config.environment.docker_image or self.task.dockerfile is not None:
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

    def _seed_once(self, spec: SandboxSpec) -> None:
        sb = self._open_main(spec)
        self._sandbox = sb
        self._user_in_place = sb.default_user
        workdir = sb.workdir
        script = Script()
        stdin: bytes | None = None
        script.add(f"mkdir -p /logs/agent /logs/verifier /logs/artifacts /tests {STAGE_DIR} && "
                   f"chmod 0777 /logs/agent /logs/verifier /logs/artifacts && chmod 0700 {STAGE_DIR} || "
                   + script.flag("failed"))
        cfg = self.task.config.environment
        if cfg.docker_image and self.task.dockerfile is None and self.task.compose_file is None \
                and self.task.environment_dir is not None:
            builder = ArchiveBuilder()
            builder.add_tree(self.task.environment_dir, workdir, honour_ignore=False, root=self.task.path)
            if builder:
                stdin = builder.render()  # the archive travels on the exec's stdin: no separate upload
                script.add(f"tar -xpf - -C / || {script.flag('failed')}")
        result = sb.exec(script.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin)
        if not result.ok or parse(result.stdout, script.marker).has("failed"):
            raise SandboxError(f"seeding commands failed (exit {result.exit_code}): {result.stderr[-500:]}",
                               field="seed", rule="GYM-2", retryable=True)
        hc = cfg.healthcheck
        if hc is not None:
            passed, attempts = poll_healthcheck(
                hc, lambda cmd, t: sb.exec(["bash", "-c", cmd], timeout=t, user=sb.default_user, cwd=workdir))
            if not passed:
                raise SeedError(f"[environment].healthcheck failed after {attempts} attempt(s)",
                                path=self.task.path / "task.toml", field="environment.healthcheck",
                                rule="GYM-2", retryable=True)

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
