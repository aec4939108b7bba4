"""`summarize`: per-task figures of a results folder's rows (pure; the summary table of ``harbor-gym run``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from harbor_gym.run.rows import is_pass

__all__ = ["TaskSummary", "summarize"]


@dataclass
class TaskSummary:
    """One task's figures.

    Attributes:
        episodes: rows of the task (graded + failed), each ``(task, rollout)`` once by its final attempt;
            ``graded`` of them in ``rollouts.jsonl``.
        mean_reward: mean roll-up reward of the graded episodes (``None`` when none).
        mean_reward_all: GYM-12: mean over all rollouts, failed ones counting 0 (``None`` when none).
        agent_outages: GYM-12: failed episodes that ended in an agent-caused outage.
        step_pass: step name -> (turns that passed, turns that ran) over the graded episodes (pass: reward >= 1.0).
        early_stops: graded episodes with ``stopped_after_turn`` set (STOP-9).
        failure_kinds: failure kind -> count, over failed episodes and failed turns of graded ones.
    """

    task_id: str
    episodes: int = 0
    graded: int = 0
    reward_sum: float = 0.0
    step_pass: dict[str, list[int]] = field(default_factory=dict)
    early_stops: int = 0
    failure_kinds: Counter = field(default_factory=Counter)
    agent_outages: int = 0

    @property
    def failed(self) -> int:
        return self.episodes - self.graded

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.graded if self.graded else None

    @property
    def mean_reward_all(self) -> float | None:
        return self.reward_sum / self.episodes if self.episodes else None

    def step_pass_text(self, sep: str = ", ") -> str:
        """``name passed/ran`` per step, in turn order."""
        return sep.join(f"{name} {p}/{n}" for name, (p, n) in self.step_pass.items())


def summarize(rollouts: Iterable[dict[str, Any]], failures: Iterable[dict[str, Any]]) -> list[TaskSummary]:
    """Fold rollout rows and failure rows (as dicts read from the files) into per-task summaries, sorted by id."""
    by_task: dict[str, TaskSummary] = {}

    def of(task_id: str) -> TaskSummary:
        return by_task.setdefault(task_id, TaskSummary(task_id))

    for row in rollouts:
        s = of(row["task_id"])
        s.episodes += 1
        s.graded += 1
        s.reward_sum += float(row.get("reward") or 0.0)
        if row.get("stopped_after_turn"):
            s.early_stops += 1
        for turn in sorted(row.get("turns", []), key=lambda t: t.get("index", 0)):
            counts = s.step_pass.setdefault(turn["step_name"], [0, 0])
            counts[1] += 1
            counts[0] += int(is_pass(turn.get("reward")))
            if turn.get("failure_kind"):
                s.failure_kinds[turn["failure_kind"]] += 1
    for row in failures:
        s = of(row["task_id"])
        s.episodes += 1
        s.failure_kinds[row.get("failure_kind") or "unknown"] += 1
        s.agent_outages += int(bool(row.get("agent_caused")))
    return [by_task[k] for k in sorted(by_task)]
