"""Gymnasium spaces shared by every harbor_gym env: Unicode text, scripts, and the turn observation.

The spaces are identical for every task (one fixed bound on turns and text lengths), so envs of different tasks
stack into one vector env. Gymnasium's ``Text`` is limited to a charset; `UnicodeText` accepts any ``str`` up to a
length and samples deterministically under the space's seed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

__all__ = [
    "UnicodeText",
    "ScriptSpace",
    "MAX_TURNS",
    "MAX_TEXT_LENGTH",
    "NOOP_SCRIPTS",
    "observation_space",
]

#: One bound on turns for every task (a task with more steps is refused when the env is built).
MAX_TURNS = 1024
#: One bound on the length of instructions and scripts, in characters.
MAX_TEXT_LENGTH = 1 << 20
#: What `ScriptSpace.sample` yields: scripts that do nothing (SPEC GYM-4).
NOOP_SCRIPTS: tuple[str, ...] = (":", "true", ": no-op", "# harbor_gym no-op\n:", "exit 0")

# Code point ranges sampled by UnicodeText: printable ASCII, Latin-1, Greek, CJK; never surrogates.
_SAMPLE_RANGES = ((0x20, 0x7E), (0xA1, 0xFF), (0x391, 0x3C9), (0x4E00, 0x4E80))


class UnicodeText(spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters.

    ``sample()`` draws a short string (at most 64 characters) from a fixed set of code point ranges with the space's
    ``np_random``, so the same seed gives the same samples.
    """

    def __init__(self, max_length: int = MAX_TEXT_LENGTH, *, seed: int | np.random.Generator | None = None):
        if max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {max_length}")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        ranges = self.np_random.integers(0, len(_SAMPLE_RANGES), size=length)
        chars = []
        for index in ranges:
            low, high = _SAMPLE_RANGES[int(index)]
            chars.append(chr(int(self.np_random.integers(low, high + 1))))
        return "".join(chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def to_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        return list(sample_n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.max_length == self.max_length


class ScriptSpace(UnicodeText):
    """The action space: a bash script (any ``str``). ``sample()`` only ever yields no-op scripts (SPEC GYM-4).

    ``step()`` also accepts ``Oracle()`` and agent objects, which are not members of this space.
    """

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return NOOP_SCRIPTS[int(self.np_random.integers(0, len(NOOP_SCRIPTS)))]


def observation_space(*, with_task_id: bool = False) -> spaces.Dict:
    """The observation space of SPEC GYM-3 (plus ``task_id`` for dataset envs), identical for every task."""
    entries: dict[str, spaces.Space] = {
        "step_name": UnicodeText(256),
        "turn_index": spaces.Discrete(MAX_TURNS + 1),
        "num_turns": spaces.Discrete(MAX_TURNS + 1),
        "instruction": UnicodeText(MAX_TEXT_LENGTH),
    }
    if with_task_id:
        entries["task_id"] = UnicodeText(256)
    return spaces.Dict(entries)
