"""`Episode`: the turn engine. ``start()`` seeds the agent sandbox (GYM-2), ``run_turn(action)`` runs one turn
(SPEC §4: clean up → prepare → agent → artifacts → verify → decide), ``result()`` gives the `EpisodeResult`.

Every rule of SPEC TURN, VER, RWD, STOP, BUD, ART, USR and ORACLE is applied here (effects) or in the pure deciders
it calls (`_rewards`, `_rollup`, `_stop`, `_budgets`, `_modes`). The engine knows no Gymnasium.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harbor_gym.agents import (
    AgentOutcome,
    AgentStatus,
    Oracle,
    ScriptAgent,
    Turn,
    agent_identity,
    agent_timeout_cap,
    as_agent,
    build_trajectory,
)
from harbor_gym.agents._oracle import ORACLE_LOG, ORACLE_RUN
from harbor_gym.config import AgentOutcomePolicy, EnvConfig, Semantics, TurnSessions
from harbor_gym.errors import (
    HarborGymError,
    ImageError,
    ResetNeededError,
    SandboxError,
    SandboxPathError,
    SandboxUnavailableError,
    SeedError,
    SeedRefusedError,
    SessionMismatchError,
)
from harbor_gym.episode._artifacts import collect, plan_entries, run_hooks
from harbor_gym.episode._budgets import (
    StepBudgets,
    agent_budget,
    episode_deadline,
    healthcheck_worst_case,
    setup_bound,
    verifier_budget,
)
from harbor_gym.episode._clock import DeadlineClock, DeadlinePassed
from harbor_gym.episode._healthcheck import poll_healthcheck
from harbor_gym.episode._logs import EpisodeLogs, TurnDirs
from harbor_gym.episode._modes import effective_verifier_mode, render_instruction, verifier_command
from harbor_gym.episode._records import EpisodeResult, ManifestEntry, TurnRecord, TurnResult
from harbor_gym.episode._rewards import RewardReading, read_reward_files, turn_reward
from harbor_gym.episode._rollup import ScoreKind, TurnScore, episode_verifier_mode, roll_up
from harbor_gym.episode._shell import Script, parse, q
from harbor_gym.episode._spec import agent_spec, resolved_env, seed_refusals, verifier_spec
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._stop import TurnFault, decide_turn, min_reward_missed
from harbor_gym.sandbox.base import ExecResult, Sandbox, SandboxSettings, SandboxSpec
from harbor_gym.task import Step, Task

__all__ = ["Episode", "EpisodeState", "SETUP_FAILED", "WORKDIR_FAILED", "HEALTHCHECK_FAILED", "ENGINE_ERROR_KIND"]

_log = logging.getLogger("harbor_gym.episode")

SETUP_FAILED = "harbor:step_setup_failed"
WORKDIR_FAILED = "harbor:step_workdir_failed"
HEALTHCHECK_FAILED = "harbor:step_healthcheck_failed"
#: A defect inside the engine itself during a turn (recorded like an outage: truncated, retryable).
ENGINE_ERROR_KIND = "harbor_gym:engine_error"

#: Bound of the engine's own housekeeping execs (clean-up, staging); the deadline may cut it shorter.
_HOUSEKEEPING_S = 120.0
#: Bytes of each reward file and of test-stdout.txt read back inline (a longer test-stdout.txt is copied).
_INLINE_CAP = 65536
_REWARD_CAP = 262144
_VERIFIER_TOOLS = ("bash", "timeout", "tar", "gzip", "find")


class EpisodeState(str, enum.Enum):
    """Lifecycle: created → running (after ``start``) → over (after the last turn or a stop) → closed."""

    CREATED = "created"
    RUNNING = "running"
    OVER = "over"
    CLOSED = "closed"


def _default_factory(config: EnvConfig) -> Callable[[SandboxSpec], Sandbox]:
    def factory(spec: SandboxSpec) -> Sandbox:
        from harbor_gym import sandbox as sandbox_pkg

        return sandbox_pkg.open(spec, backend=config.backend.value, settings=SandboxSettings.from_config(config))

    return factory


def _is_root(user: str | None) -> bool:
    return user is None or user.split(":")[0] in ("root", "0")


@dataclass
class _Turn:
    """Mutable working state of one turn (internal)."""

    step: Step
    index: int
    dirs: TurnDirs
    instruction: str
    mode: str
    agent: Any
    timings: dict[str, float] = field(default_factory=dict)
    outcome: AgentOutcome | None = None
    manifest: tuple[ManifestEntry, ...] = ()
    reading: RewardReading | None = None
    verified: bool = False
    verifier_timed_out: bool = False
    masked: bool = False
    mask_reason: str | None = None
    prep_kind: str | None = None
    engine_error: bool = False
    prelude: Script | None = None
    prelude_stdin: bytes | None = None
    art_snapshot: bool = False


class Episode:
    """One episode of one task on one agent sandbox (SPEC §4-§11, §13).

    Use as a context manager, or call ``close()`` (idempotent): it stops every sandbox and removes temporary logs.

    Args:
        task: a loaded `Task` (or a task folder path, loaded with ``config``).
        config: an `EnvConfig` or a ``dict`` (defaults when ``None``).
        sandbox_factory: ``spec -> started Sandbox``; default: ``harbor_gym.sandbox.open`` with ``config.backend``.
        agent: the announced agent (GYM-4), needed by LOAD-20/22 checks in ``start()``.
    """

    def __init__(self, task: Task | str | os.PathLike, config: EnvConfig | dict | None = None,
                 sandbox_factory: Callable[[SandboxSpec], Sandbox] | None = None, agent: Any = None) -> None:
        self.config = EnvConfig.coerce(config)
        if not isinstance(task, Task):
            from harbor_gym.task import load_task

            task = load_task(task, self.config)
        self.task = task
        self.agent = agent
        self._harbor = self.config.semantics == Semantics.HARBOR
        self._factory = sandbox_factory or _default_factory(self.config)
        self._custom_factory = sandbox_factory is not None
        self._multiplier = self.config.timeout_multiplier or task.timeout_multiplier or 1.0
        self._modes = [
            effective_verifier_mode(getattr(s.verifier_mode, "value", s.verifier_mode),
                                    declares_artifacts=s.artifacts_declared,
                                    separate_for_artifacts=self.config.separate_verifier_for_artifacts)
            for s in task.steps
        ]
        self._state = EpisodeState.CREATED
        self._sandbox: Sandbox | None = None
        self._others: list[Sandbox] = []
        self._records: list[TurnRecord] = []
        self._scores: list[TurnScore] = []
        self._verified_modes: list[str] = []
        self._response: str | None = None
        self._result: EpisodeResult | None = None
        self._cleanup_pending = False
        self._user_in_place: str | None = None
        self._logs: EpisodeLogs | None = None
        self._clock = DeadlineClock(None, wall=self.config.deadline_clock.value == "wall")
        self._env: dict[str, str] = {}
        self._solution_env: dict[str, str] = {}
        self._session_agent: Any = None
        self._timings: dict[str, float] = {}
        self._agent_spec: SandboxSpec | None = None
        self._group: Any = None

    # --- public state ------------------------------------------------------------------------------------
    @property
    def state(self) -> EpisodeState:
        return self._state

    @property
    def turn_index(self) -> int:
        """0-based index of the next turn (= the number of turns that ran)."""
        return len(self._records)

    @property
    def next_step(self) -> Step | None:
        """The step the next ``run_turn`` runs; ``None`` when the episode is over, closed or not started."""
        if self._state is not EpisodeState.RUNNING or self.turn_index >= len(self.task.steps):
            return None
        return self.task.steps[self.turn_index]

    @property
    def next_instruction(self) -> str:
        """GYM-3/TURN-9: exactly what the next turn's agent will receive; ``""`` when there is no next turn."""
        step = self.next_step
        if step is None:
            return ""
        return render_instruction(step.instruction, self.config.prompt_template, index=step.index,
                                  harbor=self._harbor)

    @property
    def is_over(self) -> bool:
        """True once the episode has ended (last turn, stop, outage, deadline) or was closed."""
        return self._state in (EpisodeState.OVER, EpisodeState.CLOSED)

    @property
    def log_dir(self) -> str | None:
        """The episode's host log folder when ``logs_root`` is set, else ``None``."""
        return self._logs.public(self._logs.root) if self._logs is not None else None

    @property
    def sandbox(self) -> Sandbox | None:
        """The agent sandbox while it runs (for inspection; never needed to drive the episode)."""
        return self._sandbox

    # --- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> "Episode":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def start(self) -> None:
        """GYM-2: refuse (LOAD-20..24, GYM-4, BUD-7) before any sandbox starts, then start and seed the agent
        sandbox (workdir, ``/logs`` folders, FMT-10 files, ``[environment].healthcheck``) and start the clock.

        Raises:
            SeedRefusedError: a seed refusal; nothing was started.
            SeedError: the seed healthcheck failed, or the sandbox stayed out after ``seed_retries`` retries
                (``retryable=True``); an image that cannot be had (``retryable=False``). Nothing is left running.
            ResetNeededError: ``start()`` was already called.
        """
        if self._state is not EpisodeState.CREATED:
            raise ResetNeededError(f"start() on an episode that is {self._state.value}; make a new Episode",
                                   field="Episode.start", rule="GYM-2")
        t0 = time.monotonic()
        separate = [s for s, m in zip(self.task.steps, self._modes) if m == "separate"]
        seed_refusals(self.task, self.config, self.agent, backend=self._backend_name(), separate_steps=separate)
        self._env = resolved_env(self.task.config.environment.env, where="environment.env")
        self._solution_env = resolved_env(self.task.config.solution.env, where="solution.env")
        spec = agent_spec(self.task, env=self._env)
        self._agent_spec = spec
        self._clock = DeadlineClock(self._deadline(), wall=self.config.deadline_clock.value == "wall")
        self._logs = EpisodeLogs(self.config.logs_root, self.task.id)
        try:
            self._seed_with_retries(spec)
        except BaseException:
            self._stop_sandboxes()
            self._logs.close()
            self._state = EpisodeState.CLOSED
            raise
        self._state = EpisodeState.RUNNING
        self._timings["seed"] = time.monotonic() - t0
        self._clock.start()

    def run_turn(self, action: Any) -> TurnResult:
        """Run the next step's turn with ``action`` (a ``str`` script, ``Oracle()`` or an agent; GYM-4).

        Never raises for what happens inside the turn: outages, deadlines and agent errors become the record's
        ``failure_kind`` (STOP-6/8, BUD-8).

        Raises:
            ResetNeededError: the episode is not running (not started, over or closed; GYM-7).
            TypeError: ``action`` is not an action (nothing ran).
            SessionMismatchError: ``turn_sessions='continue'`` and a different agent object (SES-3; nothing ran).
        """
        if self._state is not EpisodeState.RUNNING:
            raise ResetNeededError(
                "run_turn() needs a running episode" + (": call start() first" if self._state is
                                                        EpisodeState.CREATED else f"; it is {self._state.value}"),
                field="Episode.run_turn", rule="GYM-7")
        agent = as_agent(action)
        if self.config.turn_sessions == TurnSessions.CONTINUE:
            if self._session_agent is None:
                self._session_agent = action
            elif action is not self._session_agent:
                raise SessionMismatchError("turn_sessions='continue' needs the same agent object every turn",
                                           field="action", rule="SES-3")
        with self._clock.inside():
            return self._run_turn(agent)

    def result(self) -> EpisodeResult:
        """The episode's result: final once the episode is over, else a provisional roll-up of the turns so far."""
        if self._result is not None:
            return self._result
        return self._build_result(graded=True, failure_kind=None, retryable=False, final=False)

    def close(self) -> None:
        """Stop every sandbox of the episode and remove temporary logs. Idempotent; never raises for a dead
        sandbox (GYM-7, STOP-10)."""
        if self._state is EpisodeState.CLOSED:
            return
        try:
            self._stop_sandboxes()
        finally:
            if self._logs is not None:
                self._logs.close()
            self._state = EpisodeState.CLOSED

    # --- seeding -----------------------------------------------------------------------------------------
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
        last: SandboxError | None = None
        for attempt in range(attempts):
            try:
                self._seed_once(spec)
                return
            except SandboxUnavailableError as exc:
                self._stop_sandboxes()
                raise SeedRefusedError(f"no provider here can run this task: {exc}", path=self.task.path,
                                       field="environment", rule="LOAD-24") from exc
            except ImageError as exc:
                self._stop_sandboxes()
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

    # --- helpers -----------------------------------------------------------------------------------------
    def _exec(self, sb: Sandbox, command: Any, *, timeout: float | None, user: str | None,
              env: dict[str, str] | None = None, cwd: str | None = None, stdin: bytes | None = None) -> ExecResult:
        """``sb.exec`` bounded by the deadline; a command cut by the deadline raises `DeadlinePassed` (BUD-8)."""
        bound = self._clock.bound(timeout)
        result = sb.exec(command, timeout=bound, user=user, env=env, cwd=cwd, stdin=stdin)
        if result.timed_out:
            self._clock.check()
        return result

    # --- one turn ----------------------------------------------------------------------------------------
    def _run_turn(self, agent: Any) -> TurnResult:
        index = self.turn_index
        step = self.task.steps[index]
        dirs = self._logs.turn(step.name, multi_step=self.task.is_multi_step, harbor=self._harbor)
        t = _Turn(step=step, index=index, dirs=dirs, agent=agent, mode=self._modes[index],
                  instruction=render_instruction(step.instruction, self.config.prompt_template, index=index,
                                                 harbor=self._harbor))
        fault = TurnFault.NONE
        t_turn = time.monotonic()
        try:
            fault = self._turn_phases(t)
        except DeadlinePassed:
            fault = TurnFault.DEADLINE
        except SandboxError as exc:
            _log.warning("sandbox outage in turn %s of %s: %s", step.name, self.task.id, exc)
            fault = TurnFault.OUTAGE
        except Exception:  # the turn boundary: a defect becomes the record's failure kind, never an escape
            _log.error("engine error in turn %s of %s:\n%s", step.name, self.task.id, traceback.format_exc())
            fault, t.engine_error = TurnFault.OUTAGE, True
        t.timings["turn"] = time.monotonic() - t_turn
        if fault is TurnFault.NONE and self._clock.remaining() is not None and self._clock.remaining() <= 0:
            fault = TurnFault.DEADLINE
        return self._decide(t, fault)

    def _turn_phases(self, t: _Turn) -> TurnFault:
        """TURN-1: prepare → agent → artifacts → verify; returns the strongest graded fault (STOP-7)."""
        self._clock.check()
        with _timed(t, "prepare"):
            t.prep_kind = self._prepare(t)
        if t.prep_kind is not None:
            return TurnFault.PREP_FAILED
        with _timed(t, "agent"):
            t.outcome = self._activate(t)
        if t.outcome is None:  # the preparation folded into the oracle's exec failed (TURN-8)
            return TurnFault.PREP_FAILED
        policy = None if self._harbor else t.outcome.effective_policy(self.config.agent_outcome_policy)
        if policy is AgentOutcomePolicy.RETRY:
            return TurnFault.AGENT_RETRY
        if policy is AgentOutcomePolicy.FAIL:
            return TurnFault.AGENT_FAIL
        with _timed(t, "artifacts"):
            self._collect(t)
        with _timed(t, "verify"):
            self._verify(t)
        if t.masked:
            return TurnFault.MASKED
        if not self._has_result(t):
            return TurnFault.NO_REWARD
        if min_reward_missed(t.reading.rewards, t.step.min_reward) and t.index < len(self.task.steps) - 1:
            return TurnFault.MIN_REWARD
        return TurnFault.NONE

    def _has_result(self, t: _Turn) -> bool:
        """A valid reward file; under Harbor a timed-out verifier has no result (DIFF-15)."""
        return bool(t.reading and t.reading.valid and not (self._harbor and t.verifier_timed_out))

    # --- prepare (TURN-2..8, USR-2, ORACLE-1) ------------------------------------------------------------
    def _agent_user(self, step: Step) -> str:
        """USR-1: the step's agent user, else the image's default user."""
        return step.agent_user or self._sandbox.default_user

    def _cleanup_fragment(self, script: Script) -> None:
        """TURN-2 (Harbor: also empties /logs/agent, DIFF-6)."""
        text = ("find /tests /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; "
                "chmod 0777 /logs/verifier && rm -f /logs/agent/trajectory.json")
        script.add(f"{{ {text} ; }} || {script.flag('outage', 'cleanup')}")

    def _solution_fragment(self, script: Script, user: str) -> None:
        """ORACLE-1 (Harbor: merged over earlier files, DIFF-19) from the staged ``sol`` folder."""
        parts = [] if self._harbor else ["rm -rf /solution"]
        parts += ["mkdir -p /solution",
                  f"{{ [ ! -d {STAGE_DIR}/sol ] || cp -a {STAGE_DIR}/sol/. /solution/ ; }}",
                  f"rm -rf {STAGE_DIR}/sol"]
        if not _is_root(user):
            parts.append(f"chown -R {q(user)} /solution")
        script.add("{ " + " && ".join(parts) + " ; } || " + script.flag("outage", "solution"))

    def _prepare(self, t: _Turn) -> str | None:
        """TURN-3: clean-up (TURN-2), user switch (USR-2), workdir merge (TURN-4), setup.sh (TURN-5), healthcheck
        (TURN-7), the oracle's solution (ORACLE-1). Returns a TURN-8 failure kind, or ``None``.

        Raises:
            SandboxError: an outage (clean-up, user switch or solution placement could not run; TURN-8).
        """
        sb, step = self._sandbox, t.step
        workdir = sb.workdir
        user = self._agent_user(step)
        is_oracle = isinstance(t.agent, Oracle)
        script, builder = Script(), ArchiveBuilder()
        if self._cleanup_pending:
            self._cleanup_fragment(script)
        if self._harbor and t.index > 0:
            script.add("find /logs/agent -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; chmod 0777 /logs/agent")
        if user != self._user_in_place and not self._harbor and workdir != "/":
            script.add(f"chown {q(user)} {q(workdir)} || {script.flag('outage', 'user')}")
        if step.workdir_dir is not None:
            builder.add_tree(step.workdir_dir, workdir, honour_ignore=False, root=self.task.path)
        has_workdir = bool(builder)
        solution_now = is_oracle and step.setup_script is None and step.healthcheck is None
        if is_oracle and step.solution_dir is not None:
            builder.add_tree(step.solution_dir, f"{STAGE_DIR}/sol", honour_ignore=True, root=self.task.path)
        stdin: bytes | None = None
        if builder:
            stdin = builder.render()  # on the exec's stdin: one round trip for staging and housekeeping
            fail = script.flag("workdir_failed") if has_workdir else script.flag("outage", "stage")
            script.add(f"tar -xpf - -C / 2>&1 || {fail}")
        if solution_now:
            self._solution_fragment(script, user)
        if solution_now and _is_root(user):
            # One round trip: the oracle's activation runs right after this housekeeping, in the same exec.
            t.prelude, t.prelude_stdin = script, stdin
            self._cleanup_pending = False
            self._user_in_place = user
            return None
        if script:
            self._run_root(script, t, stdin)
            self._cleanup_pending = False
            if t.prep_kind is not None:
                return t.prep_kind
        self._user_in_place = user
        if step.setup_script is not None:
            bound = setup_bound(self.config.step_setup_timeout_s, self._agent_budget(step), harbor=self._harbor)
            res = self._exec(sb, ["bash", f"{workdir.rstrip('/')}/setup.sh"], timeout=bound, user=user, cwd=workdir)
            (t.dirs.agent / "setup.txt").write_text(res.stdout + res.stderr)
            if not res.ok:
                _log.info("setup.sh of %s failed (exit %s, timed out %s)", step.name, res.exit_code, res.timed_out)
                return SETUP_FAILED
        if step.healthcheck is not None:
            passed, _ = poll_healthcheck(
                step.healthcheck,
                lambda cmd, tmo: self._exec(sb, ["bash", "-c", cmd], timeout=tmo, user=user, cwd=workdir),
                on_tick=self._clock.check)
            if not passed:
                return HEALTHCHECK_FAILED
        if is_oracle and not solution_now:
            script = Script()
            self._solution_fragment(script, user)
            self._run_root(script, t)
        return None

    def _run_root(self, script: Script, t: _Turn, stdin: bytes | None = None) -> None:
        """Run a housekeeping script as root; map its flags: ``outage`` raises, ``workdir_failed`` sets TURN-8."""
        res = self._exec(self._sandbox, script.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin)
        flags = parse(res.stdout, script.marker)
        if flags.has("outage") or res.timed_out or res.exit_code not in (0,):
            what = " ".join(flags.first("outage") or ["exit", str(res.exit_code)])
            raise SandboxError(f"housekeeping failed ({what}): {res.stderr[-300:]}", field=t.step.name,
                               rule="TURN-8", retryable=True)
        if flags.has("workdir_failed"):
            _log.info("workdir merge of %s failed: %s", t.step.name, res.stdout[-500:])
            t.prep_kind = WORKDIR_FAILED

    # --- the agent (TURN-9/10, GYM-4/5, BUD-1) -------------------------------------------------------------
    def _agent_budget(self, step: Step) -> float | None:
        return agent_budget(step.agent_timeout_sec, None, self._multiplier, agent_timeout_cap(self.agent))

    def _activate(self, t: _Turn) -> AgentOutcome:
        sb, step = self._sandbox, t.step
        budget = agent_budget(step.agent_timeout_sec, None, self._multiplier, agent_timeout_cap(t.agent))
        bounded = self._clock.bound(budget)
        turn = Turn(step_name=step.name, index=t.index, num_steps=len(self.task.steps), instruction=t.instruction,
                    user=self._user_in_place, budget_sec=budget, workdir=sb.workdir, _exec_fn=sb.exec,
                    _deadline=None if bounded is None else time.monotonic() + bounded,
                    solution_env=self._solution_env if isinstance(t.agent, Oracle) else {})
        if t.prelude is not None:
            outcome = self._run_folded_oracle(t, turn)
            if outcome is None:
                return None
        elif isinstance(t.agent, (ScriptAgent, Oracle)):
            outcome = self._call_agent(t.agent, turn)
        else:
            outcome = self._call_in_thread(t.agent, turn, bounded)
        if outcome.status is AgentStatus.TIMEOUT:
            self._clock.check()
        self._response = outcome.response  # STOP-9: the last turn whose agent ran
        name = "oracle.txt" if isinstance(t.agent, Oracle) else "output.txt"
        (t.dirs.agent / name).write_text(outcome.output_tail or "")
        (t.dirs.agent / "outcome.json").write_text(json.dumps({
            "status": outcome.status.value, "policy": outcome.policy.value if outcome.policy else None,
            "exit_code": outcome.exit_code, "response": outcome.response}, indent=2))
        return outcome

    def _run_folded_oracle(self, t: _Turn, turn: Turn) -> AgentOutcome | None:
        """ORACLE-1/2 with their preparation in one exec (root agent user): the housekeeping prelude, then, if it
        succeeded, ``/solution/solve.sh`` under the agent budget. ``None``: the prelude failed (TURN-8)."""
        script = t.prelude
        script.add('[ -z "$HGFAIL" ] || exit 0')
        script.add(f"cd {q(turn.workdir)} 2>/dev/null; {ORACLE_RUN}; echo {q(script.marker)} rc $?")
        script.add(f"printf '%s file oracle.txt 0\\n' {q(script.marker)}; tail -c 4096 {ORACLE_LOG} 2>/dev/null; "
                   f"printf '\\n%s end\\n' {q(script.marker)}")
        env = {**turn.solution_env, "DEBIAN_FRONTEND": "noninteractive"}
        res = turn.exec(["sh", "-c", script.text()], env=env, stdin=t.prelude_stdin)
        flags = parse(res.stdout, script.marker)
        if flags.has("outage"):
            raise SandboxError(f"housekeeping failed ({' '.join(flags.first('outage'))})", field=t.step.name,
                               rule="TURN-8", retryable=True)
        if flags.has("workdir_failed"):
            t.prep_kind = WORKDIR_FAILED
            return None
        rc = flags.first("rc")
        tail = flags.files.get("oracle.txt", (0, ""))[1]
        if res.timed_out or rc is None:
            return AgentOutcome(status=AgentStatus.TIMEOUT, output_tail=tail or res.stderr[-4096:])
        return AgentOutcome(status=AgentStatus.COMPLETED, exit_code=int(rc[0]), output_tail=tail)

    def _call_agent(self, agent: Any, turn: Turn) -> AgentOutcome:
        try:
            outcome = agent.run(turn)
        except SandboxError:
            if self._sandbox is None or not self._sandbox.is_alive():
                raise
            return AgentOutcome(status=AgentStatus.ERROR, output_tail=traceback.format_exc()[-4096:])
        except Exception:  # an agent's own defect is its error outcome (GYM-5), not the engine's
            return AgentOutcome(status=AgentStatus.ERROR, output_tail=traceback.format_exc()[-4096:])
        if not isinstance(outcome, AgentOutcome):
            return AgentOutcome(status=AgentStatus.ERROR,
                                output_tail=f"run() returned {type(outcome).__name__}, not AgentOutcome (GYM-5)")
        return outcome

    def _call_in_thread(self, agent: Any, turn: Turn, bounded: float | None) -> AgentOutcome:
        """GYM-5: a ``run()`` still busy at the end of its budget is stopped (its execs end) and is a timeout."""
        box: list[Any] = []

        def work() -> None:
            try:
                box.append(self._call_agent(agent, turn))
            except BaseException as exc:  # an outage inside the agent: handed to the engine's thread
                box.append(exc)

        worker = threading.Thread(target=work, daemon=True, name=f"harbor-gym-agent-{turn.step_name}")
        worker.start()
        worker.join(None if bounded is None else bounded + 0.5)
        if worker.is_alive():
            turn.expire()
            return AgentOutcome(status=AgentStatus.TIMEOUT, output_tail="harbor_gym: run() overran its budget")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else AgentOutcome(status=AgentStatus.ERROR)

    # --- artifacts (ART-1..5) ----------------------------------------------------------------------------
    def _collect(self, t: _Turn) -> None:
        sb, step = self._sandbox, t.step
        def main_hook(cmd: str, user: str | None, tmo: float) -> ExecResult:
            return self._exec(sb, ["bash", "-c", cmd], timeout=tmo, user=user or self._user_in_place, cwd=sb.workdir)

        def sidecar_hook(service: str, cmd: str, user: str | None, tmo: float) -> ExecResult | None:
            side = self._sidecar(service)  # COMPOSE-3: no workdir, user or env of main
            return None if side is None else self._exec(side, ["sh", "-c", cmd], timeout=tmo, user=user)

        plan = plan_entries(step)
        if t.mode == "shared" and not step.collect and [p.origin for p in plan] == ["convention"]:
            # One round trip fewer: the verify exec snapshots /logs/artifacts (after the agent, before test.sh)
            # and the snapshot is copied out only when it holds something (ART-1 order kept).
            t.art_snapshot = True
            return
        main_plan = [p for p in plan if p.service is None]
        side_plan = [p for p in plan if p.service is not None]
        done: list[str] = []
        run_hooks(step.collect, main_hook)
        manifest = collect(sb, main_plan, t.dirs.artifacts, harbor=False, write_manifest=False, done=done)
        run_hooks(step.collect, main_hook, sidecar_hook if self._group is not None else None, sidecars=True)
        manifest += collect(sb, side_plan, t.dirs.artifacts, harbor=False, sidecars=self._sidecar, done=done,
                            write_manifest=False)
        t.manifest = manifest  # DIFF-13: the Seed side under both semantics
        (t.dirs.artifacts / "manifest.json").write_text(json.dumps([m.to_dict() for m in manifest], indent=2))
        self._clock.check()

    # --- the verifier (VER-3..11) ------------------------------------------------------------------------
    def _verify(self, t: _Turn) -> None:
        step = t.step
        budget = verifier_budget(step.verifier_timeout_sec, self._multiplier)
        env = {**self._env, **resolved_env(step.verifier_env, where=f"steps.{step.name}.verifier.env")}
        doc = build_trajectory(t.instruction, agent_identity(t.agent),
                               t.outcome.trajectory if t.outcome is not None else None)
        payload = json.dumps(doc, indent=2).encode()
        (t.dirs.agent / "trajectory.json").write_bytes(payload)
        builder = ArchiveBuilder()
        builder.add_bytes(payload, "/logs/agent/trajectory.json", mode=0o644)
        if t.mode == "separate":
            spec, uploads = verifier_spec(self.task, step, agent=self._agent_spec)
            if t.index == len(self.task.steps) - 1 and self._sandbox is not None:
                # VER-3: on the last step, the agent sandbox (and its group) stops before the verify.
                (self._group or self._sandbox).stop()
            vsb = self._factory(spec)
            self._others.append(vsb)
            try:
                for entry in t.manifest:
                    if entry.status != "ok" or entry.service is not None:
                        continue
                    local = t.dirs.artifacts / entry.destination
                    if local.is_dir():
                        builder.add_artifact_tree(local, entry.source)
                    elif local.is_file():
                        builder.add_file(local, entry.source, clear_setid=True)
                self._run_verifier(t, vsb, builder, uploads, budget, env, shared=False)
            finally:
                self._others.remove(vsb)
                vsb.stop()
        else:
            self._run_verifier(t, self._sandbox, builder, True, budget, env, shared=True)
        t.verified = True

    def _run_verifier(self, t: _Turn, sb: Sandbox, builder: ArchiveBuilder, upload_tests: bool, budget: float,
                      env: dict[str, str], *, shared: bool) -> None:
        """VER-6/7/11, RWD-1: one staged upload, then one exec (two when the verifier user is not root)."""
        step = t.step
        if upload_tests:
            for layer in step.tests_layers:
                builder.add_tree(layer, "/tests", honour_ignore=True, root=self.task.path)
            builder.add_file(step.test_script, "/tests/test.sh", mode=0o755)
        stdin = builder.render()  # tests + trajectory (+ artifacts) on the staging exec's stdin
        user = step.verifier_user or sb.default_user
        as_root = _is_root(user)
        is_last = t.index == len(self.task.steps) - 1
        prep = Script()
        tools = " ".join(_VERIFIER_TOOLS)
        prep.add(f"for t in {tools}; do command -v $t >/dev/null 2>&1 || {prep.flag('missing', '$t')}; done")
        if t.art_snapshot:
            prep.add(f"rm -rf {STAGE_DIR}/art; if [ -n \"$(ls -A /logs/artifacts 2>/dev/null)\" ]; then "
                     f"cp -a /logs/artifacts {STAGE_DIR}/art && {prep.note('art')}; fi")
        prep.add("find /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null; "
                 + ("" if upload_tests else ": ") + "find /tests -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null; "
                 "mkdir -p /tests /logs/verifier /logs/agent; chmod 0777 /logs/verifier; "
                 f"tar -xpf - -C / || {prep.flag('outage', 'stage')}; chmod +x /tests/test.sh 2>/dev/null")
        run = Script() if not as_root else prep
        run.add(f"cd {q(sb.workdir)} 2>/dev/null || cd /")
        run.add(f"{verifier_command(budget, harbor=self._harbor)}; echo {q(run.marker)} rc $?")
        self._emit(run)
        if as_root and shared and not is_last:
            # TURN-2 for the next turn, folded in when nothing more has to be copied out first.
            run.add("n=$(find /logs/verifier -mindepth 1 -maxdepth 1 ! -name reward.json ! -name reward.txt "
                    "! -name test-stdout.txt | wc -l); s=$(wc -c < /logs/verifier/test-stdout.txt 2>/dev/null "
                    f"|| echo 0); if [ \"$n\" = 0 ] && [ \"$s\" -le {_INLINE_CAP} ]; then "
                    "find /tests /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; "
                    "chmod 0777 /logs/verifier; rm -f /logs/agent/trajectory.json; "
                    f"{run.note('cleaned')}; fi")
        host_wait = budget + (5.0 if self._harbor else self.config.verifier_grace_s)
        pflags = None
        if not as_root:
            pre = self._exec(sb, prep.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin)
            pflags = parse(pre.stdout, prep.marker)
            if self._masked_by(t, pflags):
                return
            if pflags.has("outage") or not pre.ok:
                raise SandboxError(f"verifier staging failed: {pre.stderr[-300:]}", field=step.name, rule="VER-6",
                                   retryable=True)
        res = self._exec(sb, run.text(), timeout=host_wait, user="root" if as_root else user, env=env,
                         stdin=stdin if as_root else None)
        flags = parse(res.stdout, run.marker)
        if as_root and self._masked_by(t, flags):
            return
        if as_root and flags.has("outage"):
            raise SandboxError(f"verifier staging failed: {res.stderr[-300:]}", field=step.name, rule="VER-6",
                               retryable=True)
        rc = flags.first("rc")
        art_noted = (pflags or flags).has("art")
        if res.timed_out or rc is None:
            # The host stopped waiting (VER-7): read what the verifier left in a second call.
            t.verifier_timed_out = True
            again = Script()
            self._emit(again)
            res2 = sb.exec(again.text(), timeout=_HOUSEKEEPING_S, user="root")
            flags = parse(res2.stdout, again.marker)
        elif not self._harbor and rc and rc[0] in ("124", "137"):
            t.verifier_timed_out = True
        if t.art_snapshot:
            # the snapshot note comes from the first exec; after a host-side kill it may be lost: then try
            self._snapshot_artifacts(t, sb, art_noted or t.verifier_timed_out)
        files = flags.files
        t.reading = read_reward_files(
            files["reward.json"][1] if "reward.json" in files else None,
            files["reward.txt"][1] if "reward.txt" in files else None,
            booleans_are_numbers=self._harbor)
        if shared:
            self._cleanup_pending = not flags.has("cleaned")
        self._write_verifier_logs(t, sb, flags)

    def _snapshot_artifacts(self, t: _Turn, sb: Sandbox, present: bool) -> None:
        """ART-1/4 for a convention-only turn: copy the verify exec's snapshot of ``/logs/artifacts`` out."""
        plan = plan_entries(t.step)
        status = "empty"
        out = t.dirs.artifacts / plan[0].destination
        out.mkdir(parents=True, exist_ok=True)
        if present:
            with tempfile.TemporaryDirectory(prefix="hg-art-") as tmp:
                try:
                    got = sb.get(f"{STAGE_DIR}/art", Path(tmp))
                    shutil.copytree(got, out, dirs_exist_ok=True)
                    status = "ok" if any(out.iterdir()) else "empty"
                except SandboxPathError:
                    status = "empty"
                except SandboxError as exc:
                    _log.warning("artifacts of %s not copied: %s (ART-3)", t.step.name, exc)
                    status = "failed"
        t.manifest = (ManifestEntry(plan[0].source, plan[0].destination, "directory", status, None, (),
                                    plan[0].origin),)
        (t.dirs.artifacts / "manifest.json").write_text(json.dumps([m.to_dict() for m in t.manifest], indent=2))

    def _emit(self, script: Script) -> None:
        script.emit_file("/logs/verifier/reward.json", "reward.json", _REWARD_CAP)
        script.emit_file("/logs/verifier/reward.txt", "reward.txt", _REWARD_CAP)
        script.emit_file("/logs/verifier/test-stdout.txt", "test-stdout.txt", _INLINE_CAP)
        script.add("for f in /logs/verifier/* /logs/verifier/.[!.]*; do [ -e \"$f\" ] || continue; "
                   "case \"${f##*/}\" in reward.json|reward.txt|test-stdout.txt) ;; *) "
                   + script.note("extra", '"${f##*/}"') + ";; esac; done")

    def _masked_by(self, t: _Turn, flags: Any) -> bool:
        """VER-11: a missing tool masks the turn (``mask_reason = "verifier_error"``); test.sh did not start."""
        missing = flags.flags.get("missing")
        if not missing:
            return False
        t.masked, t.mask_reason = True, "verifier_error"
        _log.warning("verifier of %s masked: missing %s (VER-11)", t.step.name, [m[0] for m in missing if m])
        return True

    def _write_verifier_logs(self, t: _Turn, sb: Sandbox, flags: Any) -> None:
        out = t.dirs.verifier
        for name, (size, text) in flags.files.items():
            (out / name).write_text(text)
        big = "test-stdout.txt" in flags.files and flags.files["test-stdout.txt"][0] > _INLINE_CAP
        if flags.has("extra") or big:
            with tempfile.TemporaryDirectory(prefix="hg-ver-") as tmp:
                try:
                    got = sb.get("/logs/verifier", Path(tmp))
                    shutil.copytree(got, out, dirs_exist_ok=True)
                except SandboxError as exc:
                    _log.warning("could not copy /logs/verifier of %s: %s", t.step.name, exc)

    # --- decide (RWD, STOP) ------------------------------------------------------------------------------
    def _decide(self, t: _Turn, fault: TurnFault) -> TurnResult:
        n = len(self.task.steps)
        is_last = t.index == n - 1
        verdict = decide_turn(fault, is_first=t.index == 0, is_last=is_last, prep_kind=t.prep_kind,
                              deadline_enforced=self.config.enforce_task_timeouts, harbor=self._harbor)
        reading = t.reading
        has_result = self._has_result(t)
        missed = bool(reading is not None and t.verified and not t.masked
                      and min_reward_missed(reading.rewards if has_result else {}, t.step.min_reward))
        if fault is TurnFault.MASKED:
            kind: ScoreKind | None = ScoreKind.MASKED
        elif t.verified:
            kind = ScoreKind.VERIFIED if has_result else ScoreKind.NO_RESULT
        elif fault is TurnFault.PREP_FAILED and t.index > 0:
            kind = ScoreKind.PREP_FAILED
        else:
            kind = None  # ungraded: outage, deadline, agent retry/fail, step-1 preparation failure
        if kind is ScoreKind.VERIFIED:
            reward: float | None = turn_reward(reading.rewards)
            rewards = dict(reading.rewards)
        elif kind in (ScoreKind.NO_RESULT, ScoreKind.PREP_FAILED):
            reward, rewards = (None if self._harbor else 0.0), {}
        else:
            reward, rewards = None, {}
        if kind is not None:
            self._scores.append(TurnScore(kind, rewards))
        if t.verified and not t.masked:
            self._verified_modes.append(t.mode)
        failure_kind = t.prep_kind if fault is TurnFault.PREP_FAILED else verdict.failure_kind
        if t.engine_error:
            failure_kind = ENGINE_ERROR_KIND
        record = TurnRecord(
            task_id=self.task.id, step_name=t.step.name, index=t.index, instruction=t.instruction,
            reward=reward, verifier_rewards=rewards, reward_valid=bool(has_result),
            masked=t.masked, verifier_mode=t.mode if t.verified else None, failure_kind=failure_kind,
            min_reward_missed=missed, agent_status=t.outcome.status.value if t.outcome else None,
            exit_code=t.outcome.exit_code if t.outcome else None,
            output_tail=t.outcome.output_tail if t.outcome else None, manifest=t.manifest,
            log_dir=self._logs.public(t.dirs.turn), timings=dict(t.timings), mask_reason=t.mask_reason)
        self._records.append(record)
        for k, v in t.timings.items():
            self._timings[k] = self._timings.get(k, 0.0) + v
        (t.dirs.turn / "record.json").write_text(json.dumps(record.to_dict(), indent=2))
        episode = None
        if verdict.ends:
            ungraded_kind = failure_kind if not verdict.graded else (verdict.failure_kind or failure_kind)
            if t.engine_error:
                ungraded_kind = ENGINE_ERROR_KIND
            self._result = self._build_result(graded=verdict.graded, failure_kind=ungraded_kind,
                                              retryable=verdict.retryable)
            episode = self._result
            self._state = EpisodeState.OVER
            self._stop_sandboxes()  # STOP-10
            if self._logs is not None and self._logs.kept:
                (self._logs.root / "result.json").write_text(json.dumps(episode.to_dict(), indent=2))
        return TurnResult(record=record, terminated=verdict.terminated, truncated=verdict.truncated,
                          episode=episode)

    def _build_result(self, *, graded: bool, failure_kind: str | None, retryable: bool,
                      final: bool = True) -> EpisodeResult:
        """RWD-7..10, STOP-9: the episode result from the turns so far (``final=False``: provisional)."""
        strategy = getattr(self.task.config.multi_step_reward_strategy, "value",
                           self.task.config.multi_step_reward_strategy) or "mean"
        roll = roll_up(self._scores, strategy, harbor=self._harbor)
        n = len(self.task.steps)
        ran = len(self._records)
        return EpisodeResult(
            task_id=self.task.id,
            reward=roll.reward if graded and not roll.masked else None,
            verifier_rewards=dict(roll.verifier_rewards) if graded and not roll.masked else {},
            strategy=strategy,
            verifier_mode=episode_verifier_mode(self._verified_modes),
            turns=tuple(self._records),
            stopped_after_turn=self._records[-1].step_name if final and 0 < ran < n else None,
            masked=roll.masked,
            graded=graded,
            failure_kind=failure_kind,
            retryable=retryable,
            response=self._response,
            log_dir=self.log_dir,
            timings=dict(self._timings),
        )



class _timed:
    """Context manager adding the block's duration to ``t.timings[name]``."""

    def __init__(self, t: _Turn, name: str) -> None:
        self.t, self.name = t, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: Any) -> None:
        self.t.timings[self.name] = self.t.timings.get(self.name, 0.0) + time.monotonic() - self.start
