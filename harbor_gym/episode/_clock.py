"""The episode deadline clock (SPEC BUD-6..8): counts time inside the engine (``env``) or wall time (``wall``)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["DeadlineClock", "DeadlinePassed"]


class DeadlinePassed(Exception):
    """Internal signal: the episode deadline passed during a phase (BUD-8). Never leaves the engine."""


class DeadlineClock:
    """Tracks the time charged to an episode against ``deadline_s`` (``None`` = no deadline).

    ``env`` mode charges only time spent inside `inside()` blocks (``start()`` and ``run_turn()``); ``wall`` mode
    charges wall time since `start()`.
    """

    def __init__(self, deadline_s: float | None, *, wall: bool) -> None:
        self.deadline_s = deadline_s
        self.wall = wall
        self._started: float | None = None
        self._spent = 0.0
        self._entered: float | None = None

    def start(self) -> None:
        """Start counting ("sandbox ready", BUD-6)."""
        now = time.monotonic()
        self._started = now
        if self._entered is not None:
            self._entered = now

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Charge the time of the block (``env`` mode)."""
        self._entered = time.monotonic()
        try:
            yield
        finally:
            if self._started is not None and self._entered is not None:
                self._spent += time.monotonic() - max(self._entered, self._started)
            self._entered = None

    def spent(self) -> float:
        """Seconds charged so far."""
        if self._started is None:
            return 0.0
        now = time.monotonic()
        if self.wall:
            return now - self._started
        running = (now - max(self._entered, self._started)) if self._entered is not None else 0.0
        return self._spent + running

    def remaining(self) -> float | None:
        """Seconds left before the deadline (may be ≤ 0); ``None`` without a deadline or before `start`."""
        if self.deadline_s is None or self._started is None:
            return None
        return self.deadline_s - self.spent()

    def bound(self, seconds: float | None) -> float | None:
        """``seconds`` cut to the time left (``None`` = unbounded on both sides)."""
        left = self.remaining()
        if left is None:
            return seconds
        left = max(0.0, left)
        return left if seconds is None else min(seconds, left)

    def check(self) -> None:
        """Raise `DeadlinePassed` if the deadline has passed."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise DeadlinePassed()
