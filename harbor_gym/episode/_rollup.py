"""Pure roll-up of turn results into the episode reward (SPEC RWD-6..11, DIFF-1/2/3, RWD-10)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Sequence

__all__ = ["TurnScore", "ScoreKind", "RollUp", "roll_up", "episode_verifier_mode"]


class ScoreKind(str, enum.Enum):
    """What a turn that ran contributes to the roll-up."""

    #: a valid reward file was read
    VERIFIED = "verified"
    #: verified, but no valid reward file (RWD-6; Harbor: no result, DIFF-2/DIFF-15)
    NO_RESULT = "no_result"
    #: preparation failed at step >= 2 (RWD-6; Harbor: left out, DIFF-1)
    PREP_FAILED = "prep_failed"
    #: the turn was masked (RWD-9)
    MASKED = "masked"


@dataclass(frozen=True)
class TurnScore:
    """One turn's input to the roll-up: its kind and, for ``VERIFIED``, its verifier rewards."""

    kind: ScoreKind
    rewards: Mapping[str, int | float] = field(default_factory=dict)


@dataclass(frozen=True)
class RollUp:
    """Episode reward (``None`` when masked or when nothing counts under Harbor) and per-key rewards.

    A ``mean`` roll-up is a ``float``; ``final`` passes the last turn's dict through unchanged (an ``int`` reward
    stays an ``int``, issue 16)."""

    reward: int | float | None
    verifier_rewards: Mapping[str, int | float]
    masked: bool = False


def roll_up(scores: Sequence[TurnScore], strategy: str, *, harbor: bool = False, single_step: bool = False) -> RollUp:
    """Combine the turns that ran (in order) per ``strategy`` (``"mean"`` or ``"final"``; ``None`` = mean).

    Seed (default): a ``NO_RESULT`` or ``PREP_FAILED`` turn is a measured 0 (``0.0``, ``{}``) and counts (RWD-6).
    ``mean`` (RWD-7): reward = mean of turn rewards (RWD-5: the ``reward`` key, else 0); for every key seen in any
    turn, the mean of its values with a missing key = 0. ``final`` (RWD-8): the last turn's. A masked turn masks the
    episode (RWD-9). Harbor (``harbor=True``): those turns have no result and are left out of ``mean`` (DIFF-1/2);
    ``final`` of a last turn without result is ``None`` (DIFF-3); nothing counted = ``None``. A single-step task
    (``single_step``) rolls up like ``final``: its one dict passes through unchanged, ints included (issue 16).
    """
    if any(s.kind is ScoreKind.MASKED for s in scores):
        return RollUp(None, {}, masked=True)
    if not scores:
        return RollUp(None, {})
    if (strategy or "mean") == "final" or single_step:
        last = scores[-1]
        if last.kind is ScoreKind.VERIFIED:
            rewards = dict(last.rewards)
            return RollUp(_reward_of(rewards, harbor), rewards)
        return RollUp(None if harbor else 0.0, {})
    counted = [dict(s.rewards) if s.kind is ScoreKind.VERIFIED else {} for s in scores
               if not harbor or s.kind is ScoreKind.VERIFIED]
    if not counted:
        return RollUp(None, {})
    keys = sorted({k for r in counted for k in r})
    n = len(counted)
    per_key = {k: float(sum(r.get(k, 0.0) for r in counted) / n) for k in keys}
    if harbor:
        # Harbor's episode reward is the per-key mean's "reward" entry (None without that key).
        return RollUp(per_key.get("reward"), per_key)
    reward = float(sum(r.get("reward", 0.0) for r in counted) / n)
    return RollUp(reward, per_key)


def _reward_of(rewards: Mapping[str, int | float], harbor: bool) -> int | float | None:
    if "reward" in rewards:
        return rewards["reward"]
    return None if harbor else 0.0


def episode_verifier_mode(modes: Sequence[str]) -> str | None:
    """RWD-10: the one mode all verified turns used, ``"mixed"`` if they differ, ``None`` if none verified."""
    distinct = set(modes)
    if not distinct:
        return None
    return distinct.pop() if len(distinct) == 1 else "mixed"
