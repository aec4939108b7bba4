"""Pure stop deciders: ``min_reward`` (SPEC STOP-2..4) and what a turn's outcome does to the episode (STOP-1,
STOP-5..9, BUD-8, DIFF-4/16)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

__all__ = [
    "min_reward_missed",
    "TurnFault",
    "TurnVerdict",
    "decide_turn",
    "OUTAGE_KIND",
    "STORAGE_EXCEEDED_KIND",
    "AGENT_RETRY_KIND",
    "AGENT_FAILED_KIND",
    "DEADLINE_KIND",
    "DEADLINE_NOT_ENFORCED_KIND",
    "ENGINE_ERROR_KIND",
    "WORKDIR_MISSING_KIND",
    "WORKDIR_DELETED_KIND",
]

OUTAGE_KIND = "harbor_gym:sandbox_outage"
#: GYM-10/12: the agent sandbox's writable size reached its bound (``storage_mb`` or the default) in a failed turn.
STORAGE_EXCEEDED_KIND = "harbor_gym:storage_exceeded"
AGENT_RETRY_KIND = "harbor_gym:agent_retry"
AGENT_FAILED_KIND = "harbor_gym:agent_failed"
DEADLINE_KIND = "harbor:task_deadline"
DEADLINE_NOT_ENFORCED_KIND = "Episode timed out"
#: A defect inside harbor_gym at a turn boundary: ungraded, never retryable (a bug does not go away by repeating).
ENGINE_ERROR_KIND = "harbor_gym:engine_error"
#: Issue 16: the task's workdir does not exist when the first step starts (the image lacks it and nothing of the
#: task created it; Harbor semantics do not create it): the task's fault, ungraded, never retryable.
WORKDIR_MISSING_KIND = "harbor_gym:workdir_missing"
#: Issue 16 / GYM-12: the workdir existed at an earlier step and is gone at a later step's start: the agent's doing
#: (reward 0.0, trainable), never the ungraded `WORKDIR_MISSING_KIND` a policy could learn to dodge zeros with.
WORKDIR_DELETED_KIND = "harbor_gym:workdir_deleted"


def min_reward_missed(rewards: Mapping[str, float] | None, min_reward: float | Mapping[str, float] | None) -> bool:
    """STOP-2/3: a number gates ``rewards["reward"]``; a table gates each named key. Missed iff a gated key is
    absent or below its threshold. ``min_reward=None``: never missed."""
    if min_reward is None:
        return False
    thresholds = {"reward": min_reward} if isinstance(min_reward, (int, float)) else dict(min_reward)
    have = rewards or {}
    return any(key not in have or have[key] < float(x) for key, x in thresholds.items())


class TurnFault(str, enum.Enum):
    """The worst thing that happened in a turn, in STOP-7 precedence order (first = strongest)."""

    ENGINE_ERROR = "engine_error"
    OUTAGE = "outage"
    STORAGE = "storage"
    WORKDIR_DELETED = "workdir_deleted"
    DEADLINE = "deadline"
    AGENT_RETRY = "agent_retry"
    AGENT_FAIL = "agent_fail"
    WORKDIR_MISSING = "workdir_missing"
    PREP_FAILED = "prep_failed"
    MASKED = "masked"
    NO_REWARD = "no_reward"
    MIN_REWARD = "min_reward"
    NONE = "none"


@dataclass(frozen=True)
class TurnVerdict:
    """What a turn's outcome does to the episode.

    Attributes:
        ends: no later step runs (STOP-10).
        terminated, truncated: the Gymnasium flags of this turn (GYM-7).
        graded: the episode keeps a reward; ``False``: ungraded (reward ``None``).
        retryable: an ungraded end that may succeed when repeated.
        failure_kind: the episode's failure kind, if any.
    """

    ends: bool
    terminated: bool
    truncated: bool
    graded: bool = True
    retryable: bool = False
    failure_kind: str | None = None


def decide_turn(
    fault: TurnFault,
    *,
    is_first: bool,
    is_last: bool,
    prep_kind: str | None = None,
    deadline_enforced: bool = True,
    harbor: bool = False,
) -> TurnVerdict:
    """STOP-1/5..9, BUD-8: the verdict for a turn whose strongest fault (STOP-7) is ``fault``.

    ``min_reward`` on the last step changes nothing (STOP-4): the caller passes ``MIN_REWARD`` and it ends there
    anyway. A step-1 preparation failure is terminal and ungraded (STOP-5); under Harbor it is retryable (DIFF-4).
    A missing workdir (issue 16) is ungraded and never retryable; one deleted after an earlier step ends like an
    agent-caused outage (truncated, retryable, which `harbor-gym run` does not retry, GYM-12).
    """
    if fault is TurnFault.ENGINE_ERROR:
        return TurnVerdict(True, False, True, graded=False, retryable=False, failure_kind=ENGINE_ERROR_KIND)
    if fault is TurnFault.OUTAGE:
        return TurnVerdict(True, False, True, graded=False, retryable=True, failure_kind=OUTAGE_KIND)
    if fault is TurnFault.STORAGE:  # GYM-10: ends the turn like an outage, under its own (agent-caused) kind
        return TurnVerdict(True, False, True, graded=False, retryable=True, failure_kind=STORAGE_EXCEEDED_KIND)
    if fault is TurnFault.WORKDIR_DELETED:  # GYM-12: ends like an agent-caused outage (the caller marks it so)
        return TurnVerdict(True, False, True, graded=False, retryable=True, failure_kind=WORKDIR_DELETED_KIND)
    if fault is TurnFault.WORKDIR_MISSING:  # the task's fault: repeating gives the same, under both semantics
        return TurnVerdict(True, True, False, graded=False, retryable=False, failure_kind=WORKDIR_MISSING_KIND)
    if fault is TurnFault.DEADLINE:
        kind = DEADLINE_KIND if deadline_enforced else DEADLINE_NOT_ENFORCED_KIND
        return TurnVerdict(True, False, True, graded=False, retryable=True, failure_kind=kind)
    if fault is TurnFault.AGENT_RETRY:
        return TurnVerdict(True, True, False, graded=False, retryable=True, failure_kind=AGENT_RETRY_KIND)
    if fault is TurnFault.AGENT_FAIL:
        return TurnVerdict(True, True, False, graded=False, retryable=False, failure_kind=AGENT_FAILED_KIND)
    if fault is TurnFault.PREP_FAILED:
        if is_first:
            return TurnVerdict(True, True, False, graded=False, retryable=harbor, failure_kind=prep_kind)
        return TurnVerdict(True, True, False, graded=True, failure_kind=prep_kind)
    if fault in (TurnFault.MASKED, TurnFault.NO_REWARD, TurnFault.MIN_REWARD):
        return TurnVerdict(True, True, False, graded=True)
    return TurnVerdict(is_last, is_last, False, graded=True)
