"""`run_rollouts`: the scheduler behind ``harbor-gym run`` — K rollouts of every task, C at a time, with retries,
resume and a clean Ctrl-C.

Guarantees:
- Each episode runs through `HarborEnv` (reset, then one ``step`` per turn), so its row is built from the same info
  records `RecordRollouts` sees (`harbor_gym.run.rows.rows_from_episode`).
- Episodes run on a pool of C threads (they wait on sandboxes, not on Python). Sandboxes come from the env's
  ``sandbox_factory`` (default: the config's backend), so a warm pool can be swapped in.
- A retryable failure (outage, deadline, ``SeedError(retryable=True)``, agent ``retry``) is retried up to R times;
  only the last attempt is written (to the failures file when it still fails). An agent-caused outage (GYM-12) is
  not retried unless ``EnvConfig.retry_agent_outages`` (``--retry-agent-outages``): it is a failed rollout.
- Resume: ``(task_id, rollout)`` keys already in ``rollouts.jsonl`` or ``rollouts_failures.jsonl`` are skipped.
- Ctrl-C (``KeyboardInterrupt`` in the calling thread): nothing new is scheduled, running sandboxes are stopped,
  the interrupted episodes write nothing, finished rows stay; the report says ``interrupted``.
- The per-rollout seed is `episode_seed(seed, task_id, rollout)`; reruns are reproducible.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from harbor_gym.config import EnvConfig
from harbor_gym.errors import HarborGymError, SeedError, SeedRefusedError
from harbor_gym.run.agents import AgentSpec
from harbor_gym.run.jsonl import RolloutFiles
from harbor_gym.run.rows import (
    ENV_ERROR,
    SEED_FAILED,
    SEED_REFUSED,
    TASK_LOAD_FAILED,
    FailureRow,
    RolloutRow,
    episode_seed,
    rows_from_episode,
)
from harbor_gym.run.summary import TaskSummary, summarize
from harbor_gym.run.targets import Targets
from harbor_gym.run.trajectories import TrajectoryWriter

__all__ = ["RunOptions", "RunReport", "RunListener", "run_rollouts", "LOGS_DIR"]

_log = logging.getLogger("harbor_gym.run")

#: Per-turn folders land under ``<out>/logs/<task_id>/rollout-<k>/`` (the engine's layout below that).
LOGS_DIR = "logs"
#: How long a Ctrl-C waits for running episodes to wind down after their sandboxes were stopped.
_SHUTDOWN_WAIT_S = 120.0


@dataclass(frozen=True)
class RunOptions:
    """What to run and how (the flags of ``harbor-gym run``).

    Attributes:
        agent: the resolved ``--agent``.
        out: the results folder (created; reused to resume).
        rollouts_per_task: K >= 1. concurrency: C >= 1 episodes at a time. retries: R >= 0 per episode.
        seed: base seed of `episode_seed`.
        config: the base `EnvConfig` (backend, labels, ...); ``logs_root`` is set per rollout.
        sandbox_factory: passed to every `HarborEnv` (``None``: the config's backend).
        save_trajectories: also write each written episode's turn outcomes and model calls to
            ``<out>/trajectories.jsonl`` (`harbor_gym.run.trajectories`, GYM-13).
    """

    agent: AgentSpec
    out: Path
    rollouts_per_task: int = 1
    concurrency: int = 1
    retries: int = 2
    seed: int = 0
    config: EnvConfig = field(default_factory=EnvConfig)
    sandbox_factory: Callable | None = None
    save_trajectories: bool = False


@dataclass
class RunReport:
    """What a run did. ``exit_code``: 0 every episode graded, 1 some episode failed or a task failed to load,
    130 interrupted."""

    out: Path
    scheduled: int = 0
    skipped: int = 0
    graded: int = 0
    failed: int = 0
    interrupted: bool = False
    summaries: list[TaskSummary] = field(default_factory=list)
    load_failures: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.load_failures or any(s.failed for s in self.summaries):
            return 1
        return 0


class RunListener(Protocol):
    """Progress events of a run (all called from worker threads except `started` and `finished`)."""

    def started(self, total: int, skipped: int) -> None: ...

    def episode_started(self, task_id: str, rollout: int) -> None: ...

    def episode_retry(self, task_id: str, rollout: int, attempt: int, reason: str) -> None: ...

    def episode_done(self, task_id: str, rollout: int, row: RolloutRow | FailureRow) -> None: ...

    def episode_abandoned(self, task_id: str, rollout: int) -> None: ...

    def finished(self, report: RunReport) -> None: ...


class _Silent:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class _Runner:
    def __init__(self, targets: Targets, options: RunOptions, listener: RunListener) -> None:
        self.targets = targets
        self.opts = options
        self.listener = listener
        self.files = RolloutFiles(options.out)
        self._trajectories = TrajectoryWriter(options.out) if options.save_trajectories else None
        self._episode_records: dict[tuple[str, int], tuple[int, list]] = {}  # the last attempt's turn records
        self.stop = threading.Event()
        self._active: dict[int, Any] = {}
        self._lock = threading.Lock()

    # --- one episode -------------------------------------------------------------------------------------
    def _logs_root(self, task_id: str, rollout: int) -> Path:
        return self.opts.out / LOGS_DIR / task_id / f"rollout-{rollout}"

    def run_one(self, task: Any, rollout: int) -> RolloutRow | FailureRow | None:
        """Run rollout ``rollout`` of ``task`` with retries; write and return its row (``None``: interrupted)."""
        if self.stop.is_set():
            return None
        self.listener.episode_started(task.id, rollout)
        seed = episode_seed(self.opts.seed, task.id, rollout)
        logs_root = self._logs_root(task.id, rollout)
        shutil.rmtree(logs_root, ignore_errors=True)  # what an interrupted earlier run left for this rollout
        attempts = self.opts.retries + 1
        for attempt in range(1, attempts + 1):
            row = self._attempt(task, rollout, seed, attempt, logs_root)
            if row is None or self.stop.is_set() and isinstance(row, FailureRow):
                self.listener.episode_abandoned(task.id, rollout)
                return None
            if isinstance(row, FailureRow) and self._retries(row) and attempt < attempts:
                _log.info("retrying %s rollout %d after attempt %d: %s", task.id, rollout, attempt, row.reason)
                self.listener.episode_retry(task.id, rollout, attempt, row.reason)
                continue
            self._save_trajectory(task.id, rollout, seed)
            self.files.write(row)
            self.listener.episode_done(task.id, rollout, row)
            return row
        return None  # unreachable: the last attempt always returns above

    def _save_trajectory(self, task_id: str, rollout: int, seed: int) -> None:
        """GYM-13: the written attempt's turn outcomes and model calls, when ``save_trajectories``."""
        attempt, records = self._episode_records.pop((task_id, rollout), (None, []))
        if self._trajectories is not None and attempt is not None:
            self._trajectories.write(records, task_id=task_id, rollout=rollout, seed=seed, attempt=attempt,
                                     agent=self.opts.agent.label)

    def _retries(self, row: FailureRow) -> bool:
        """A retryable failure is retried; an agent-caused outage only under ``retry_agent_outages`` (GYM-12)."""
        return row.retryable and (not row.agent_caused or self.opts.config.retry_agent_outages)

    def _attempt(self, task: Any, rollout: int, seed: int, attempt: int,
                 logs_root: Path) -> RolloutRow | FailureRow | None:
        from harbor_gym.env import HarborEnv

        key = dict(task_id=task.id, rollout=rollout, seed=seed, agent=self.opts.agent.label, attempt=attempt)
        env = None
        t0 = time.monotonic()
        try:
            agent = self.opts.agent.new()
            config = self.opts.config.replace(logs_root=str(logs_root))
            env = HarborEnv(task, config=config, agent=agent.announced, sandbox_factory=self.opts.sandbox_factory)
            with self._lock:
                self._active[id(env)] = env
            if self.stop.is_set():
                return None
            try:
                obs, _ = env.reset(seed=seed, options={"rollout": rollout})  # turn.seed, turn.rollout (GYM-13)
            except SeedRefusedError as exc:
                return FailureRow(**key, reason=str(exc), failure_kind=SEED_REFUSED, retryable=False)
            except SeedError as exc:
                return FailureRow(**key, reason=str(exc), failure_kind=SEED_FAILED, retryable=exc.retryable,
                                  duration_sec=round(time.monotonic() - t0, 3))
            records: list = []
            self._episode_records[(task.id, rollout)] = (attempt, records)
            while True:
                if self.stop.is_set():
                    return None
                obs, _, terminated, truncated, info = env.step(agent.action_for(obs["step_name"]))
                records.append(info["turn"])
                if "episode_result" in info:
                    result = info["episode_result"]
                    break
            return rows_from_episode(result, records=records, duration_sec=time.monotonic() - t0, **key)
        except Exception as exc:  # the episode boundary: a fault of the env or the user's agent becomes a row
            if self.stop.is_set():
                return None
            _log.warning("episode %s rollout %d failed: %s: %s", task.id, rollout, type(exc).__name__, exc)
            retryable = bool(getattr(exc, "retryable", False)) if isinstance(exc, HarborGymError) else False
            return FailureRow(**key, reason=f"{type(exc).__name__}: {exc}", failure_kind=ENV_ERROR,
                              retryable=retryable, duration_sec=round(time.monotonic() - t0, 3))
        finally:
            if env is not None:
                with self._lock:
                    self._active.pop(id(env), None)
                env.close()

    # --- the run -----------------------------------------------------------------------------------------
    def _write_load_failures(self) -> None:
        written = {(r.get("task_id"), r.get("reason")) for r in self.files.failures.rows() if r.get("rollout") is None}
        for task_id, error in self.targets.failures.items():
            row = FailureRow(task_id=task_id, rollout=None, seed=None, agent=self.opts.agent.label,
                             reason=str(error), failure_kind=TASK_LOAD_FAILED)
            if (task_id, row.reason) not in written:
                self.files.write(row)

    def _interrupt(self) -> None:
        """Stop scheduling and stop every running episode's sandboxes from this (the main) thread."""
        self.stop.set()
        with self._lock:
            envs = list(self._active.values())
        for env in envs:
            try:
                env.close()
            except Exception as exc:  # close every env, whatever one of them does
                _log.warning("closing an env after Ctrl-C failed: %s", exc)

    def run(self) -> RunReport:
        opts = self.opts
        opts.out.mkdir(parents=True, exist_ok=True)
        report = RunReport(out=opts.out, load_failures={k: str(v) for k, v in self.targets.failures.items()})
        self._write_load_failures()
        done = self.files.done_keys()
        jobs = [(task, k) for k in range(opts.rollouts_per_task) for task in self.targets.tasks.values()
                if (task.id, k) not in done]
        report.skipped = opts.rollouts_per_task * len(self.targets.tasks) - len(jobs)
        report.scheduled = len(jobs)
        self.listener.started(len(jobs) + report.skipped, report.skipped)
        pool = ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="harbor-gym-run")
        futures: set[Future] = set()
        try:
            futures = {pool.submit(self.run_one, task, k) for task, k in jobs}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for fut in finished:
                    row = fut.result()
                    if isinstance(row, RolloutRow):
                        report.graded += 1
                    elif isinstance(row, FailureRow):
                        report.failed += 1
        except KeyboardInterrupt:
            report.interrupted = True
            self._interrupt()
            pool.shutdown(wait=False, cancel_futures=True)
            wait(futures, timeout=_SHUTDOWN_WAIT_S)
            self._interrupt()  # envs that finished seeding after the first sweep
        finally:
            pool.shutdown(wait=not report.interrupted, cancel_futures=True)
        report.summaries = self._summaries()
        self.listener.finished(report)
        return report

    def _summaries(self) -> list[TaskSummary]:
        k = self.opts.rollouts_per_task
        wanted = set(self.targets.tasks)

        def in_scope(row: dict) -> bool:
            rollout = row.get("rollout")
            return row.get("task_id") in wanted and isinstance(rollout, int) and rollout < k

        rollouts = [r for r in self.files.rollouts.rows() if in_scope(r)]
        failures = [r for r in self.files.failures.rows() if in_scope(r)]
        graded = _latest(rollouts)
        seen = {(r["task_id"], r["rollout"]) for r in graded}  # each (task, rollout) once (GYM-12)
        return summarize(graded, [r for r in _latest(failures) if (r["task_id"], r["rollout"]) not in seen])


def _latest(rows: list[dict]) -> list[dict]:
    """One row per ``(task_id, rollout)`` key (the last written wins)."""
    by_key = {(r["task_id"], r["rollout"]): r for r in rows}
    return list(by_key.values())


def run_rollouts(targets: Targets, options: RunOptions, listener: RunListener | None = None) -> RunReport:
    """Run every rollout of ``targets`` not already in ``options.out`` (see the module docstring).

    Returns:
        The `RunReport` (``interrupted`` after a Ctrl-C; the rows written so far stay in ``options.out``).

    Raises:
        ConfigError: an option is out of range (K, C < 1 or R < 0).
    """
    from harbor_gym.errors import ConfigError

    if options.rollouts_per_task < 1:
        raise ConfigError(f"must be >= 1, got {options.rollouts_per_task}", field="--rollouts-per-task")
    if options.concurrency < 1:
        raise ConfigError(f"must be >= 1, got {options.concurrency}", field="--concurrency")
    if options.retries < 0:
        raise ConfigError(f"must be >= 0, got {options.retries}", field="--retries")
    return _Runner(targets, options, listener or _Silent()).run()
