"""`Episode`: the turn engine. ``start()`` seeds the agent sandbox (GYM-2), ``run_turn(action)`` runs one turn
(SPEC §4: clean up → prepare → agent → artifacts → verify → decide), ``result()`` gives the `EpisodeResult`.

This module holds the lifecycle, the turn pipeline and the decision (RWD, STOP); each phase's effects live in its
own mixin module: `_seed` (GYM-2, sandboxes), `_prepare` (TURN-2..8), `_activate` (the agent, GYM-4/5),
`_collect` (ART) and `_verify` (VER, RWD-1). Pure deciders: `_rewards`, `_rollup`, `_stop`, `_budgets`, `_modes`.
The engine knows no Gymnasium.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import time
import traceback
from typing import Any, Callable

from harbor_gym.agents import as_agent
from harbor_gym.agents import Session
from harbor_gym.config import AgentOutcomePolicy, EnvConfig, Semantics
from harbor_gym.episode._activate import _ActivatePhase
from harbor_gym.episode._clock import DeadlineClock, DeadlinePassed
from harbor_gym.episode._collect import _CollectPhase
from harbor_gym.episode._freeze import freeze_mode
from harbor_gym.episode._logs import EpisodeLogs
from harbor_gym.episode._modes import effective_verifier_mode, render_instruction
from harbor_gym.episode._outage import HARNESS_KILLED, STORAGE_EXCEEDED_KIND, agent_outage_cause
from harbor_gym.episode._prepare import _PreparePhase
from harbor_gym.episode._proxy import EpisodeProxy, open_episode_proxy
from harbor_gym.episode._records import EpisodeResult, TurnRecord, TurnResult, outcome_fields
from harbor_gym.episode._rewards import REWARD_FILE_NOT_FOUND_KIND, turn_reward
from harbor_gym.episode._rollup import ScoreKind, TurnScore, episode_verifier_mode, roll_up
from harbor_gym.episode._seed import _SeedPhase
from harbor_gym.episode._session import SessionDriver
from harbor_gym.episode._spec import agent_spec, resolved_env, seed_refusals, workdir_created
from harbor_gym.episode._stop import (
    WORKDIR_DELETED_KIND,
    WORKDIR_MISSING_KIND,
    TurnFault,
    decide_turn,
    min_reward_missed,
)
from harbor_gym.episode._turnstate import (
    ENGINE_ERROR_KIND,
    HEALTHCHECK_FAILED,
    SETUP_FAILED,
    WORKDIR_FAILED,
    _timed,
    _Turn,
    one_line,
)
from harbor_gym.episode._verify import _VerifyPhase
from harbor_gym.errors import ResetNeededError, SandboxError, SeedRefusedError
from harbor_gym.sandbox._engine import engine_scope
from harbor_gym.sandbox.base import ExecResult, Sandbox, SandboxSettings, SandboxSpec
from harbor_gym.sandbox.engines import Engine, engine_set
from harbor_gym.task import Step, Task

__all__ = ["Episode", "EpisodeState", "SETUP_FAILED", "WORKDIR_FAILED", "HEALTHCHECK_FAILED", "ENGINE_ERROR_KIND",
           "WORKDIR_MISSING_KIND", "WORKDIR_DELETED_KIND"]

_log = logging.getLogger("harbor_gym.episode")


#: Issue 16: preparation outcomes that are not TURN-8 failures (no measured 0, no DIFF-4 retry).
_PREP_FAULTS = {WORKDIR_MISSING_KIND: TurnFault.WORKDIR_MISSING, WORKDIR_DELETED_KIND: TurnFault.WORKDIR_DELETED}


class EpisodeState(str, enum.Enum):
    """Lifecycle: created → running (after ``start``) → over (after the last turn or a stop) → closed."""

    CREATED = "created"
    RUNNING = "running"
    OVER = "over"
    CLOSED = "closed"


def _is_pool_factory(factory: Any) -> bool:
    """True iff ``factory`` is the warm pools' (which claim on the engine of the episode's scope, issue 17)."""
    from harbor_gym.sandbox.pool import PoolFactory

    return isinstance(factory, PoolFactory)


def _default_factory(config: EnvConfig) -> Callable[[SandboxSpec], Sandbox]:
    """``config.pool_size > 0``: the process's warm pools of that size (`harbor_gym.sandbox.pool.pool_factory`; the
    agent sandbox is claimed already seeded). ``0``: every sandbox is started on demand."""
    if config.pool_size > 0:
        from harbor_gym.sandbox.pool import pool_factory

        return pool_factory(config)

    def factory(spec: SandboxSpec) -> Sandbox:
        from harbor_gym import sandbox as sandbox_pkg

        return sandbox_pkg.open(spec, backend=config.backend.value, settings=SandboxSettings.from_config(config))

    return factory



class Episode(_SeedPhase, _PreparePhase, _ActivatePhase, _CollectPhase, _VerifyPhase):
    """One episode of one task on one agent sandbox (SPEC §4-§11, §13).

    Use as a context manager, or call ``close()`` (idempotent): it stops every sandbox and removes temporary logs.

    Args:
        task: a loaded `Task` (or a task folder path, loaded with ``config``).
        config: an `EnvConfig` or a ``dict`` (defaults when ``None``).
        sandbox_factory: ``spec -> started Sandbox``; default: ``harbor_gym.sandbox.open`` with ``config.backend``,
            or the warm pools when ``config.pool_size > 0``. A factory with ``claim_prepared(spec, key, prepare)``
            (`harbor_gym.sandbox.pool.PoolFactory`) hands out agent sandboxes already seeded (GYM-2).
        agent: the announced agent (GYM-4), needed by LOAD-20/22 checks in ``start()``.
        seed, rollout: the reset seed and rollout index, given to every agent as ``turn.seed``/``turn.rollout``.
    """

    def __init__(self, task: Task | str | os.PathLike, config: EnvConfig | dict | None = None,
                 sandbox_factory: Callable[[SandboxSpec], Sandbox] | None = None, agent: Any = None, *,
                 seed: int | None = None, rollout: int | None = None) -> None:
        self.config = EnvConfig.coerce(config)
        #: GYM-13: handed to every activation as ``turn.seed`` / ``turn.rollout``.
        self.seed, self.rollout = seed, rollout
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
        self._sessions = SessionDriver(self.config.turn_sessions, agent)
        self._timings: dict[str, float] = {}
        self._agent_spec: SandboxSpec | None = None
        self._group: Any = None
        #: GYM-11: "auto", "strict" or None (no freeze); a freeze whose thaw is still owed.
        self._freeze = freeze_mode(self.config.freeze_agent_during_verify)
        self._frozen_pending = False
        #: GYM-12: an activation has started in this episode (outages from then on may be the agent's).
        self._activated = False
        #: Issue 18: the episode's capture-proxy session (`EnvConfig.model_upstream`), else None.
        self._proxy: EpisodeProxy | None = None
        #: Issue 17: the engines of `EnvConfig.engines` and the one this episode was placed on (while it holds it).
        self._engines = engine_set(self.config.engines, self.config.engine_sockets,
                                   probe_interval_s=self.config.engine_probe_interval_s) \
            if self.config.engines and (sandbox_factory is None or _is_pool_factory(sandbox_factory)) else None
        self._engine: Engine | None = None

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

    @property
    def engine_url(self) -> str | None:
        """Issue 17: the URL of the engine of `EnvConfig.engines` this episode runs on (``None`` without them)."""
        return self._engine.url if self._engine is not None else None

    @property
    def session(self) -> Session | None:
        """The episode's cumulative harness session (SES-3: the one continued session; SES-2: the only fresh one
        if exactly one ran, else ``None``). Turns hold no session records."""
        return self._sessions.session

    @property
    def transcript(self) -> tuple[dict[str, Any], ...]:
        """The cumulative ATIF steps of ``session`` (SES-2/3); empty when more than one fresh session ran."""
        session = self.session
        return tuple(dict(s) for s in session.transcript) if session is not None else ()

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
        allow = self.config.host_env_allowlist
        self._env = resolved_env(self.task.config.environment.env, where="environment.env", allowlist=allow)
        self._solution_env = resolved_env(self.task.config.solution.env, where="solution.env", allowlist=allow)
        spec = agent_spec(self.task, env=self._env, pids_limit=self.config.pids_limit,
                          default_storage_mb=self.config.default_storage_mb,
                          default_memory_mb=self.config.default_memory_mb,
                          create_workdir=workdir_created(self.config))
        self._agent_spec = spec
        self._clock = DeadlineClock(self._deadline(), wall=self.config.deadline_clock.value == "wall")
        self._logs = EpisodeLogs(self.config.logs_root, self.task.id)
        if self._engines is not None and self.config.model_upstream is not None:
            raise SeedRefusedError("model_upstream needs the capture proxy's route on the engine's host, which "
                                   "harbor_gym opens only for the environment's engine: unset EnvConfig.engines or "
                                   "model_upstream", path=self.task.path / "task.toml", field="EnvConfig.engines",
                                   rule="LOAD-24")
        try:
            if self.config.model_upstream is not None:  # issue 18: refused here, before any sandbox starts
                self._proxy = open_episode_proxy(self.config.model_upstream, backend=self._backend_name(),
                                                 names=self.config.model_env, label=self.task.id,
                                                 where=self.task.path / "task.toml")
                # the agent sandbox (compose: service main) reaches the proxy; a separate verifier never does
                spec = self._agent_spec = dataclasses.replace(spec, host_service_port=self._proxy.port)
            self._seed_with_retries(spec)
        except BaseException:
            try:
                self._stop_sandboxes()
            finally:
                self._close_proxy()
                self._release_engine()
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
            SessionMismatchError: (a ``ValueError``) ``turn_sessions='continue'`` and an action that is not the
                agent object announced at ``start`` (SES-3; nothing ran, the episode goes on).
        """
        if self._state is not EpisodeState.RUNNING:
            raise ResetNeededError(
                "run_turn() needs a running episode" + (": call start() first" if self._state is
                                                        EpisodeState.CREATED else f"; it is {self._state.value}"),
                field="Episode.run_turn", rule="GYM-7")
        agent = as_agent(action)
        self._sessions.check(action, index=self.turn_index, step_name=self.task.steps[self.turn_index].name)
        with self._clock.inside(), engine_scope(self._engine.client if self._engine is not None else None):
            return self._run_turn(agent)

    def result(self) -> EpisodeResult:
        """The episode's result: final once the episode is over, else a provisional roll-up of the turns so far."""
        if self._result is not None:
            return self._result
        return self._build_result(graded=True, failure_kind=None, retryable=False, final=False)

    def close(self) -> None:
        """End an open harness session (SES-3: its ``close()``, exactly once, while the sandbox still runs), stop
        every sandbox of the episode and remove temporary logs. Idempotent; never raises for a dead sandbox (GYM-7,
        STOP-10)."""
        if self._state is EpisodeState.CLOSED:
            return
        try:
            try:
                self._sessions.close()
            finally:
                try:
                    self._stop_sandboxes()
                finally:
                    self._close_proxy()
                    self._release_engine()
        finally:
            if self._logs is not None:
                self._logs.close()
            self._state = EpisodeState.CLOSED

    def _close_proxy(self) -> None:
        """Issue 18: end the episode's proxy session (its token is dead from here on). Idempotent."""
        if self._proxy is not None:
            self._proxy.close()

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
            fault, t.cause = TurnFault.OUTAGE, self._outage_cause(exc)
            if self._engine is not None and self._engines is not None:  # issue 17: name an engine that is out
                down = self._engines.check(self._engine)
                if down is not None:
                    t.cause = f"{down}: {t.cause}"
            if self._activated and not t.agent_caused:  # GYM-12: did the agent break its sandbox?
                t.outage_cause = agent_outage_cause(self._sandbox)
                t.agent_caused = t.outage_cause is not None
            if t.agent_caused:
                t.cause = f"{t.cause} (agent-caused: {t.outage_cause})"
        except Exception as exc:  # the turn boundary: a defect becomes the record's failure kind, never an escape
            _log.error("engine error in turn %s of %s:\n%s", step.name, self.task.id, traceback.format_exc())
            fault, t.engine_error = TurnFault.ENGINE_ERROR, True
            t.cause = f"engine error: {type(exc).__name__}: {one_line(exc)}"
        t.timings["turn"] = time.monotonic() - t_turn
        if fault is TurnFault.NONE and self._clock.remaining() is not None and self._clock.remaining() <= 0:
            fault = TurnFault.DEADLINE
        fault = self._storage_fault(t, fault)  # GYM-10: a failed turn whose sandbox is at its storage bound
        if fault is TurnFault.DEADLINE:
            during = f"during {t.phase}" if t.phase else "before the turn began"
            t.cause = f"episode deadline of {self._clock.deadline_s:.0f} s passed {during}"
        return self._decide(t, fault)

    def _outage_cause(self, exc: SandboxError) -> str:
        """STOP-8's cause: the agent sandbox by name (``died`` when it no longer runs) and the error."""
        sb = self._sandbox
        name = getattr(sb, "name", None)
        if sb is None or not name:
            return f"sandbox outage: {one_line(exc)}"
        try:
            alive = sb.is_alive()
        except Exception:  # an engine that does not answer: the sandbox is as good as gone
            alive = False
        text = one_line(exc)
        text = text.removeprefix(f"sandbox {name}: ")  # the backend's errors often name the sandbox already
        return f"sandbox {name} {'failed' if alive else 'died'}: {text}"

    def _turn_phases(self, t: _Turn) -> TurnFault:
        """TURN-1: prepare → agent → artifacts → verify; returns the strongest graded fault (STOP-7)."""
        self._clock.check()
        with _timed(t, "prepare"):
            t.prep_kind = self._prepare(t)
        if t.prep_kind is not None:
            return _PREP_FAULTS.get(t.prep_kind, TurnFault.PREP_FAILED)
        with _timed(t, "agent"):
            t.outcome = self._activate(t)
        if t.outcome is None:  # the preparation folded into the oracle's exec failed (TURN-8)
            return _PREP_FAULTS.get(t.prep_kind, TurnFault.PREP_FAILED)
        if t.harness_killed:  # GYM-12: kill -9 -1 (or the like) by the agent, whether or not the sandbox lives
            t.agent_caused, t.outage_cause = True, HARNESS_KILLED
            raise SandboxError("the activation killed the harness's exec wrapper (kill -9 -1?)", field=t.step.name,
                               rule="GYM-12", retryable=True)
        policy = None if self._harbor else t.outcome.effective_policy(self.config.agent_outcome_policy)
        if policy in (AgentOutcomePolicy.RETRY, AgentOutcomePolicy.FAIL):
            t.cause = (f"the agent ended with status error (exit code {t.outcome.exit_code}); "
                       f"agent_outcome_policy {policy.value}")
            if t.outcome.failure_kind:  # the agent's own kind and its first output line (GYM-13)
                why = (t.outcome.output_tail or "").strip().splitlines()[:1]
                t.cause = f"{t.outcome.failure_kind}: {why[0] if why else 'no detail'}; agent_outcome_policy " \
                          f"{policy.value}"
            return TurnFault.AGENT_RETRY if policy is AgentOutcomePolicy.RETRY else TurnFault.AGENT_FAIL
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
            reward: int | float | None = turn_reward(reading.rewards, harbor=self._harbor)
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
        if fault in (TurnFault.AGENT_RETRY, TurnFault.AGENT_FAIL) and t.outcome and t.outcome.failure_kind:
            failure_kind = t.outcome.failure_kind  # the agent's own kind (GYM-13: harbor_gym:model_unreachable)
        if t.engine_error:
            failure_kind = ENGINE_ERROR_KIND
        if (fault is TurnFault.NO_REWARD and failure_kind is None and reading is not None
                and reading.source is None):  # issue 16: no reward file at all (Harbor: RewardFileNotFoundError)
            failure_kind, t.cause = REWARD_FILE_NOT_FOUND_KIND, t.cause or reading.problem
        if failure_kind == STORAGE_EXCEEDED_KIND and not t.agent_caused:  # GYM-10/12: always the agent's doing
            t.agent_caused, t.outage_cause = True, "storage_exceeded"
        if t.agent_caused:  # GYM-12/13: the agent did it; the trainer sees a 0.0 it can train on
            reward, rewards = 0.0, {}
        message = None
        if failure_kind is not None or t.masked:
            message = f"{self.task.id}: step {t.step.name}: {t.cause or failure_kind or t.mask_reason}"
        calls = outcome_fields(t.outcome)
        calls["model_calls"] = calls["model_calls"] + tuple(t.proxy_calls)  # issue 18: after the agent's own
        refused = t.proxy_refused + (self._proxy.refused_since_last() if self._proxy is not None else 0)
        record = TurnRecord(
            task_id=self.task.id, step_name=t.step.name, index=t.index, instruction=t.instruction,
            reward=reward, verifier_rewards=rewards, reward_valid=bool(has_result),
            masked=t.masked, verifier_mode=t.mode if t.verified else None, failure_kind=failure_kind,
            min_reward_missed=missed, agent_status=t.outcome.status.value if t.outcome else None,
            exit_code=t.outcome.exit_code if t.outcome else None,
            output_tail=t.outcome.output_tail if t.outcome else None, manifest=t.manifest,
            log_dir=self._logs.public(t.dirs.turn), timings=dict(t.timings), mask_reason=t.mask_reason,
            failure_message=message, **calls, freeze_exempt=tuple(t.freeze_exempt),
            agent_caused=t.agent_caused, outage_cause=t.outage_cause, model_calls_refused=refused)
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
                                              retryable=verdict.retryable, failure_message=message,
                                              agent_caused=t.agent_caused, outage_cause=t.outage_cause)
            episode = self._result
            self._state = EpisodeState.OVER
            self._sessions.close()  # SES-3: an early stop also ends the continued session, before its sandbox
            try:
                self._stop_sandboxes()  # STOP-10
            finally:
                self._close_proxy()
            if self._logs is not None and self._logs.kept:
                (self._logs.root / "result.json").write_text(json.dumps(episode.to_dict(), indent=2))
        return TurnResult(record=record, terminated=verdict.terminated, truncated=verdict.truncated,
                          episode=episode)

    def _build_result(self, *, graded: bool, failure_kind: str | None, retryable: bool,
                      final: bool = True, failure_message: str | None = None, agent_caused: bool = False,
                      outage_cause: str | None = None) -> EpisodeResult:
        """RWD-7..10, STOP-9: the episode result from the turns so far (``final=False``: provisional)."""
        strategy = getattr(self.task.config.multi_step_reward_strategy, "value",
                           self.task.config.multi_step_reward_strategy) or "mean"
        roll = roll_up(self._scores, strategy, harbor=self._harbor, single_step=len(self.task.steps) == 1)
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
            failure_message=failure_message,
            agent_caused=agent_caused,
            outage_cause=outage_cause,
            log_dir=self.log_dir,
            timings=dict(self._timings),
        )

