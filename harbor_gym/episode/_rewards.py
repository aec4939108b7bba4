"""Pure reward-file deciders: parse ``reward.json``/``reward.txt`` (SPEC RWD-1..4, DIFF-20) and the turn reward
(RWD-5). No I/O: the engine copies the files out (GYM-10) and hands their bytes here.

Size cap (RWD-1..3, GYM-10): a reward file longer than ``EnvConfig.reward_file_cap_bytes`` (64 KiB by default)
is invalid, never truncated and never judged on its first bytes; so is a reward file that is not a regular file
(a link is never followed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["RewardReading", "parse_reward_txt", "parse_reward_json", "read_reward_files", "reward_reading",
           "turn_reward", "REWARD_FILES", "REWARD_FILE_NOT_FOUND_KIND", "NO_REWARD_FILE_PROBLEM"]

#: The reward files of ``/logs/verifier``, in RWD-1 order.
REWARD_FILES = ("reward.json", "reward.txt")

#: The failure kind of a verification that wrote no reward file at all, under both semantics (Harbor names it
#: ``RewardFileNotFoundError``); an invalid reward file keeps no kind (RWD-6 / DIFF-2).
REWARD_FILE_NOT_FOUND_KIND = "harbor_gym:reward_file_not_found"

#: The problem (and failure message) of a missing reward file: the paths looked at.
NO_REWARD_FILE_PROBLEM = ("no reward file: looked for /logs/verifier/reward.json and /logs/verifier/reward.txt "
                          "(RWD-1)")


@dataclass(frozen=True)
class RewardReading:
    """What the reward files of one verification say.

    Attributes:
        valid: a valid reward file was found (RWD-1..3).
        rewards: the verifier rewards (``{}`` when not valid).
        source: ``"reward.json"``, ``"reward.txt"`` or ``None`` (no file).
        problem: why the file was refused, for logs; ``None`` when valid or absent.
    """

    valid: bool
    rewards: Mapping[str, int | float]
    source: str | None = None
    problem: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewards", dict(self.rewards))


def parse_reward_txt(text: str) -> float | None:
    """RWD-2: the value of a ``reward.txt`` text, or ``None`` if invalid (empty, not a float, not finite)."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def parse_reward_json(text: str, *, booleans_are_numbers: bool = False) -> dict[str, int | float] | None:
    """RWD-3: the rewards of a ``reward.json`` text, or ``None`` if invalid.

    Values keep their JSON type ("that object", issue 16): ``1`` stays an ``int``, ``0.5`` a ``float``.

    Valid iff it is a JSON object with at least one key whose values are all finite JSON numbers (not booleans,
    strings, nulls, arrays, objects, ``NaN``, ``Infinity`` or numbers overflowing a float). With
    ``booleans_are_numbers`` (DIFF-20, Harbor) ``true``/``false`` count as 1/0.
    """
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not data:
        return None
    out: dict[str, int | float] = {}
    for key, value in data.items():
        if isinstance(value, bool):
            if not booleans_are_numbers:
                return None
            out[key] = int(value)
            continue
        if not isinstance(value, (int, float)):
            return None
        try:
            number = float(value)
        except OverflowError:
            return None
        if not math.isfinite(number):
            return None
        out[key] = value
    return out


def read_reward_files(
    reward_json: str | None, reward_txt: str | None, *, booleans_are_numbers: bool = False
) -> RewardReading:
    """RWD-1: ``reward.json`` if it exists (``None`` = absent), else ``reward.txt``; an invalid ``reward.json`` never
    falls back to ``reward.txt``."""
    if reward_json is not None:
        rewards = parse_reward_json(reward_json, booleans_are_numbers=booleans_are_numbers)
        if rewards is None:
            return RewardReading(False, {}, "reward.json", "reward.json is not an object of finite numbers (RWD-3)")
        return RewardReading(True, rewards, "reward.json")
    if reward_txt is not None:
        value = parse_reward_txt(reward_txt)
        if value is None:
            return RewardReading(False, {}, "reward.txt", "reward.txt is not one finite number (RWD-2)")
        return RewardReading(True, {"reward": value}, "reward.txt")
    return RewardReading(False, {}, None, NO_REWARD_FILE_PROBLEM)


def reward_reading(report: Any, cap: int, *, booleans_are_numbers: bool = False) -> RewardReading:
    """RWD-1..3 from a `CopyReport` of ``/logs/verifier`` (``None``: nothing could be copied).

    A reward file that exists but is over ``cap`` bytes, or is a link or special file, is invalid (and an invalid
    ``reward.json`` never falls back to ``reward.txt``).
    """
    if report is None or report.kind != "directory":
        return read_reward_files(None, None)
    for name in REWARD_FILES:
        if name in report.links or name in report.refused:
            return RewardReading(False, {}, name, f"{name} is not a regular file (GYM-10: links are never followed)")
        got = report.files.get(name)
        if got is not None and got.truncated:
            return RewardReading(False, {}, name, f"{name} is over reward_file_cap_bytes ({cap} bytes; RWD-1, GYM-10)")
        if got is not None:
            break
    texts = {n: report.data[n].decode("utf-8", errors="replace") for n in REWARD_FILES if n in report.data}
    return read_reward_files(texts.get("reward.json"), texts.get("reward.txt"),
                             booleans_are_numbers=booleans_are_numbers)


def turn_reward(rewards: Mapping[str, int | float], *, harbor: bool = False) -> int | float | None:
    """RWD-5: ``rewards["reward"]`` when present (its JSON type kept: an ``int`` stays an ``int``), else ``0.0``;
    under Harbor semantics (issue 16) a valid file without a ``reward`` key has no turn reward (``None``)."""
    value = rewards.get("reward")
    if value is not None:
        return value
    return None if harbor else 0.0


