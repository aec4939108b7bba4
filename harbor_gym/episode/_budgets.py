"""Pure time-budget deciders (SPEC BUD-1..7, DIFF-5, DIFF-17). One function per budget; no clocks here."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from harbor_gym.task import Task

__all__ = [
    "agent_budget",
    "verifier_budget",
    "setup_bound",
    "healthcheck_worst_case",
    "StepBudgets",
    "episode_deadline",
    "task_step_budgets",
    "UNBOUNDED_TERM_S",
]

_log = logging.getLogger("harbor_gym.episode")

#: Open point 3: the deadline term of an unbounded agent budget (or setup bound) is 21,600 s.
UNBOUNDED_TERM_S = 21_600.0


def agent_budget(
    step_timeout_sec: float | None, task_timeout_sec: float | None, multiplier: float, cap: float | None = None
) -> float | None:
    """BUD-1: min(B × m, cap); B = the step's ``timeout_sec``, else ``[agent].timeout_sec``, else unbounded."""
    base = step_timeout_sec if step_timeout_sec is not None else task_timeout_sec
    budget = None if base is None else float(base) * multiplier
    if cap is not None:
        budget = cap if budget is None else min(budget, cap)
    return budget


def verifier_budget(step_verifier_timeout_sec: float, multiplier: float) -> float:
    """BUD-2: the step's verifier ``timeout_sec`` (600.0 by default, never ``[verifier]``'s) × m."""
    return float(step_verifier_timeout_sec) * multiplier


def setup_bound(step_setup_timeout_s: float | None, turn_agent_budget: float | None, *, harbor: bool = False
                ) -> float | None:
    """BUD-4: ``step_setup_timeout_s`` if set, else the turn's agent budget (``None`` = unbounded). Harbor: none
    (DIFF-5)."""
    if harbor:
        return None
    return step_setup_timeout_s if step_setup_timeout_s is not None else turn_agent_budget


def healthcheck_worst_case(start_period_sec: float, start_interval_sec: float, timeout_sec: float,
                           interval_sec: float, retries: int) -> float:
    """BUD-5: h = start_period + start_interval + (r+1)·timeout + r·interval, r = max(1, retries); never × m."""
    r = max(1, int(retries))
    return start_period_sec + start_interval_sec + (r + 1) * timeout_sec + r * interval_sec


@dataclass(frozen=True)
class StepBudgets:
    """The BUD-6 terms of one step (``None`` = unbounded or absent, as named)."""

    agent: float | None
    verifier: float
    setup: float | None = None
    has_setup: bool = False
    healthcheck: float | None = None
    collect_timeouts: Sequence[float] = ()
    separate: bool = False
    sandbox_start_allowance: float = 600.0


def episode_deadline(
    steps: Sequence[StepBudgets],
    *,
    enforce: bool,
    harness_setup_allowance_s: float,
    verifier_grace_s: float,
    default_episode_timeout_s: float,
    harbor: bool = False,
) -> float | None:
    """BUD-6/7: the episode deadline in seconds from "sandbox ready", or ``None`` (Harbor: none, DIFF-17).

    Enforced: Σ over steps of [harness allowance + setup bound (if setup.sh) + h (if a step healthcheck) + agent
    budget + verifier budget + grace + collect-hook timeouts] + one sandbox-start allowance per separate step; an
    unbounded agent budget or setup bound counts `UNBOUNDED_TERM_S`. Above ``default_episode_timeout_s`` it still
    applies, with a warning. Not enforced: ``default_episode_timeout_s``.
    """
    if harbor:
        return None
    if not enforce:
        return float(default_episode_timeout_s)
    total = 0.0
    for s in steps:
        total += harness_setup_allowance_s
        if s.has_setup:
            total += UNBOUNDED_TERM_S if s.setup is None else s.setup
        if s.healthcheck is not None:
            total += s.healthcheck
        total += UNBOUNDED_TERM_S if s.agent is None else s.agent
        total += s.verifier + verifier_grace_s + sum(s.collect_timeouts)
        if s.separate:
            total += s.sandbox_start_allowance
    if total > default_episode_timeout_s:
        _log.warning("episode deadline %.0f s exceeds default_episode_timeout_seconds %.0f s; it still applies "
                     "(BUD-6)", total, default_episode_timeout_s)
    return total


def task_step_budgets(task: "Task", modes: Sequence[str], *, multiplier: float, step_setup_timeout_s: float | None,
                      agent_cap: float | None) -> list[StepBudgets]:
    """The BUD-6 terms of every step of ``task``, ``modes`` giving each step's verifier mode (VER-1/2).

    The multiplier ``m`` scales the agent and verifier budgets only (BUD-1/2), never collect-hook or healthcheck
    numbers (BUD-3); a separate step's sandbox-start allowance is its verifier environment's
    ``build_timeout_sec``, else ``[environment]``'s (BUD-9).
    """
    steps = []
    for step, mode in zip(task.steps, modes):
        agent = agent_budget(step.agent_timeout_sec, None, multiplier, agent_cap)
        hc = step.healthcheck
        table = step.verifier_environment or task.config.environment
        steps.append(StepBudgets(
            agent=agent,
            verifier=verifier_budget(step.verifier_timeout_sec, multiplier),
            setup=setup_bound(step_setup_timeout_s, agent),
            has_setup=step.setup_script is not None,
            healthcheck=None if hc is None else healthcheck_worst_case(
                hc.start_period_sec, hc.start_interval_sec, hc.timeout_sec, hc.interval_sec, hc.retries),
            collect_timeouts=tuple(float(h.timeout_sec) for h in step.collect),
            separate=mode == "separate",
            sandbox_start_allowance=float(table.build_timeout_sec),
        ))
    return steps
