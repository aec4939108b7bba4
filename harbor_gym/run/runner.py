"""`run_rollouts`: the scheduler behind ``harbor-gym run`` — K rollouts of every task, C at a time, with retries,
resume and a clean Ctrl-C.

Guarantees:
- Built on the rollout collector (`harbor_gym.run.collector.rollouts`, issue 15): each episode runs through
  `HarborEnv` (``areset``, then one ``astep`` per turn), C in flight on the collector's C threads, and its row is
  written the moment it ends, built from the same info records `RecordRollouts` sees
  (`harbor_gym.run.rows.rows_from_episode`). Sandboxes come from ``sandbox_factory`` (default: the config's
  backend), so a warm pool can be swapped in.
- A retryable failure (outage, deadline, ``SeedError(retryable=True)``, agent ``retry``) is retried up to R times;
  only the last attempt is written (to the failures file when it still fails). An agent-caused outage (GYM-12) is
  not retried unless ``EnvConfig.retry_agent_outages`` (``--retry-agent-outages``): it is a failed rollout.
- Resume: ``(task_id, rollout)`` keys already in ``rollouts.jsonl`` or ``rollouts_failures.jsonl`` are skipped.
- Ctrl-C (SIGINT under ``asyncio.run``, or a ``KeyboardInterrupt`` such as the CLI's SIGTERM handler raises):
  nothing new is scheduled, running episodes are cancelled (their sandboxes stopped before the run returns), the
  interrupted episodes write nothing, finished rows stay; the report says ``interrupted``.
- The per-rollout seed is `episode_seed(seed, task_id, rollout)`; reruns are reproducible.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from harbor_gym.config import EnvConfig
from harbor_gym.run.agents import AgentSpec
from harbor_gym.run.collector import RolloutResult, rollouts
from harbor_gym.run.jsonl import RolloutFiles
from harbor_gym.run.rows import (
    SEED_REFUSED,
    TASK_LOAD_FAILED,
    FailureRow,
    RolloutRow,
    rows_from_episode,
)
from harbor_gym.run.summary import TaskSummary, summarize
from harbor_gym.run.targets import Targets
from harbor_gym.run.trajectories import TrajectoryWriter

__all__ = ["RunOptions", "RunReport", "RunListener", "run_rollouts", "LOGS_DIR"]

_log = logging.getLogger("harbor_gym.run")

#: Per-turn folders land under ``<out>/logs/<task_id>/rollout-<k>/`` (the engine's layout below that).
LOGS_DIR = "logs"


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
    """``harbor-gym run`` over the rollout collector (`harbor_gym.run.collector.rollouts`): it writes each yielded
    result as a row the moment its episode ends."""

    def __init__(self, targets: Targets, options: RunOptions, listener: RunListener) -> None:
        self.targets = targets
        self.opts = options
        self.listener = listener
        self.files = RolloutFiles(options.out)
        self._trajectories = TrajectoryWriter(options.out) if options.save_trajectories else None
        self._running: set[tuple[str, int]] = set()

    # --- collector hooks (called on the event loop) ------------------------------------------------------
    def _logs_root(self, task_id: str, rollout: int) -> Path:
        return self.opts.out / LOGS_DIR / task_id / f"rollout-{rollout}"

    def episode_started(self, task_id: str, rollout: int) -> None:
        self._running.add((task_id, rollout))
        shutil.rmtree(self._logs_root(task_id, rollout), ignore_errors=True)  # an interrupted earlier attempt's
        self.listener.episode_started(task_id, rollout)

    def episode_retry(self, task_id: str, rollout: int, attempt: int, reason: str) -> None:
        _log.info("retrying %s rollout %d after attempt %d: %s", task_id, rollout, attempt, reason)
        self.listener.episode_retry(task_id, rollout, attempt, reason)

    def _agent(self, task_id: str, rollout: int, seed: int) -> Any:
        return self.opts.agent.new()  # an EpisodeAgent: the announced agent and each step's action

    # --- rows --------------------------------------------------------------------------------------------
    def _backend(self) -> str | None:
        """The backend recorded in every row: the config's, ``auto`` decided as the sandboxes decide it (once per
        process; the CLI decides and announces it before the run)."""
        from harbor_gym.sandbox import config_backend

        return config_backend(self.opts.config)

    def _row(self, result: RolloutResult) -> RolloutRow | FailureRow:
        key = dict(task_id=result.task_id, rollout=result.rollout, seed=result.seed, agent=self.opts.agent.label,
                   attempt=result.attempt, backend=self._backend())
        if result.episode is not None:
            return rows_from_episode(result.episode, records=list(result.turns), duration_sec=result.duration_sec,
                                     **key)
        duration = None if result.failure_kind == SEED_REFUSED else round(result.duration_sec, 3)
        return FailureRow(**key, reason=result.reason or str(result.failure_kind), failure_kind=result.failure_kind,
                          retryable=result.retryable, duration_sec=duration)

    def _write(self, result: RolloutResult) -> RolloutRow | FailureRow:
        row = self._row(result)
        if self._trajectories is not None and result.episode is not None:  # GYM-13
            self._trajectories.write(list(result.turns), task_id=result.task_id, rollout=result.rollout,
                                     seed=result.seed, attempt=result.attempt, agent=self.opts.agent.label)
        self.files.write(row)
        self._running.discard((result.task_id, result.rollout))
        self.listener.episode_done(result.task_id, result.rollout, row)
        return row

    # --- the run -----------------------------------------------------------------------------------------
    def _write_load_failures(self) -> None:
        written = {(r.get("task_id"), r.get("reason")) for r in self.files.failures.rows() if r.get("rollout") is None}
        for task_id, error in self.targets.failures.items():
            row = FailureRow(task_id=task_id, rollout=None, seed=None, agent=self.opts.agent.label,
                             reason=str(error), failure_kind=TASK_LOAD_FAILED, backend=self._backend())
            if (task_id, row.reason) not in written:
                self.files.write(row)

    async def _collect(self, done: set, report: RunReport) -> None:
        opts = self.opts
        async for result in rollouts(self.targets.tasks, self._agent, rollouts_per_task=opts.rollouts_per_task,
                                     concurrency=opts.concurrency, config=opts.config, seed=opts.seed,
                                     retries=opts.retries, sandbox_factory=opts.sandbox_factory, skip=done,
                                     logs_dir=self._logs_root, listener=self):
            row = self._write(result)
            if isinstance(row, RolloutRow):
                report.graded += 1
            else:
                report.failed += 1

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
        try:
            # Ctrl-C: asyncio.run cancels the collector, which cancels every episode in flight (their sandboxes
            # are stopped and awaited, they write nothing); SIGTERM's KeyboardInterrupt takes the same path.
            asyncio.run(self._collect(done, report))
        except KeyboardInterrupt:
            report.interrupted = True
            for task_id, rollout in sorted(self._running):
                self.listener.episode_abandoned(task_id, rollout)
        report.summaries = self._summaries()
        self.listener.finished(report)
        return report

    def _summaries(self) -> list[TaskSummary]:
        k = self.opts.rollouts_per_task
        wanted = set(self.targets.tasks)

        def in_scope(row: dict) -> bool:
            rollout = row.get("rollout")
            return row.get("task_id") in wanted and isinstance(rollout, int) and rollout < k

        rollouts_ = [r for r in self.files.rollouts.rows() if in_scope(r)]
        failures = [r for r in self.files.failures.rows() if in_scope(r)]
        graded = _latest(rollouts_)
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
