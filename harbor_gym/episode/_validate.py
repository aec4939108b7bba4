"""Oracle validation of tasks (SPEC ORACLE-3/4): run the oracle through every step and report per step."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harbor_gym.agents import Oracle
from harbor_gym.config import EnvConfig
from harbor_gym.errors import HarborGymError
from harbor_gym.task import Task, load_task

__all__ = ["StepValidation", "ValidationReport", "validate", "validate_paths"]


@dataclass(frozen=True)
class StepValidation:
    """One step's verdict: ``validatable`` (ORACLE-3), its oracle ``reward`` (``None``: the turn did not run or had
    no reward), ``passed`` (validatable and reward 1.0) and a ``reason`` when not passed."""

    name: str
    validatable: bool
    reward: float | None
    passed: bool
    reason: str | None = None


@dataclass(frozen=True)
class ValidationReport:
    """ORACLE-4: a task passes iff every step is validatable and its oracle turn scores 1.0."""

    task_id: str
    path: str
    steps: tuple[StepValidation, ...]
    error: str | None = None
    episode: Any = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.steps) and all(s.passed for s in self.steps)

    def failing_steps(self) -> list[StepValidation]:
        """The steps that did not pass (all of them when the task could not run)."""
        return [s for s in self.steps if not s.passed]

    def summary(self) -> str:
        """A readable multi-line report naming each failing step."""
        head = f"{'PASS' if self.passed else 'FAIL'} {self.task_id} ({self.path})"
        lines = [head]
        if self.error:
            lines.append(f"  error: {self.error}")
        for s in self.steps:
            mark = "ok  " if s.passed else "FAIL"
            lines.append(f"  {mark} {s.name}: validatable={s.validatable} reward={s.reward}"
                         + (f" — {s.reason}" if s.reason and not s.passed else ""))
        return "\n".join(lines)


def validate(task_or_path: Task | str | os.PathLike, config: EnvConfig | dict | None = None, *,
             sandbox_factory: Callable | None = None) -> ValidationReport:
    """ORACLE-4: run an oracle episode over ``task_or_path`` and report each step's ``validatable`` flag and reward.

    Unvalidatable steps (ORACLE-3) still run (their turn has no solution); a step that never ran because an earlier
    one stopped the episode reports ``reward=None`` and the cause. Load and seed errors are reported, not raised.
    """
    from harbor_gym.episode._engine import Episode

    cfg = EnvConfig.coerce(config)
    try:
        task = task_or_path if isinstance(task_or_path, Task) else load_task(task_or_path, cfg)
    except HarborGymError as exc:
        name = Path(task_or_path).name if not isinstance(task_or_path, Task) else task_or_path.id
        return ValidationReport(name, str(task_or_path), (), error=str(exc))
    oracle = Oracle()
    steps: list[StepValidation] = []
    try:
        with Episode(task, cfg, sandbox_factory=sandbox_factory, agent=oracle) as episode:
            episode.start()
            while episode.next_step is not None:
                episode.run_turn(oracle)
            result = episode.result()
    except HarborGymError as exc:
        return ValidationReport(task.id, str(task.path),
                                tuple(StepValidation(s.name, s.validatable, None, False, "episode did not start")
                                      for s in task.steps), error=str(exc))
    by_name = {r.step_name: r for r in result.turns}
    for step in task.steps:
        rec = by_name.get(step.name)
        reward = rec.reward if rec is not None else None
        reason = None
        if not step.validatable:
            reason = "no solve.sh in the step's solution folder (ORACLE-3)"
        elif rec is None:
            reason = f"did not run: the episode stopped after {result.stopped_after_turn!r}"
        elif rec.failure_kind:
            reason = rec.failure_kind
        elif "reward" not in (rec.verifier_rewards or {}):
            keys = ", ".join(sorted(rec.verifier_rewards or {}))
            reason = (f"the verifier's reward file has no `reward` key (keys: {keys}); RWD-5 pays 0.0"
                      if keys else "no valid reward file (RWD-6)")
        elif reward != 1.0:
            reason = f"oracle reward {reward} != 1.0"
        steps.append(StepValidation(step.name, step.validatable, reward,
                                    step.validatable and rec is not None and reward == 1.0, reason))
    return ValidationReport(task.id, str(task.path), tuple(steps), episode=result)


def validate_paths(paths: list[str | os.PathLike], config: EnvConfig | dict | None = None) -> list[ValidationReport]:
    """Validate each task folder; a folder without ``task.toml`` is taken as a dataset of task folders."""
    reports: list[ValidationReport] = []
    for raw in paths:
        path = Path(raw)
        if (path / "task.toml").is_file():
            reports.append(validate(path, config))
            continue
        children = sorted(p for p in path.iterdir() if p.is_dir() and (p / "task.toml").is_file()) \
            if path.is_dir() else []
        if not children:
            reports.append(ValidationReport(path.name, str(path), (), error="no task.toml here or one level below"))
        for child in children:
            reports.append(validate(child, config))
    return reports
