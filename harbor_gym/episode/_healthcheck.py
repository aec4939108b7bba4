"""Healthcheck polling (SPEC TURN-7): start period, counted failures, overrun = failure."""

from __future__ import annotations

import time
from typing import Callable

from harbor_gym.sandbox.base import ExecResult
from harbor_gym.task import HealthcheckConfig

__all__ = ["poll_healthcheck"]


def poll_healthcheck(
    check: HealthcheckConfig,
    run: Callable[[str, float], ExecResult],
    *,
    sleep: Callable[[float], None] = time.sleep,
    on_tick: Callable[[], None] = lambda: None,
) -> tuple[bool, int]:
    """TURN-7: poll ``check.command`` until it passes or fails for good.

    ``run(command, timeout)`` runs one attempt in bash as the right user (a timed-out attempt is a failure).
    ``on_tick`` is called between attempts (the engine checks its deadline there).

    Returns:
        ``(passed, attempts)``.
    """
    t0 = time.monotonic()
    counted = 0
    attempts = 0
    limit = max(1, int(check.retries))
    while True:
        attempts += 1
        result = run(check.command, float(check.timeout_sec))
        if result.ok:
            return True, attempts
        if time.monotonic() < t0 + float(check.start_period_sec):
            on_tick()
            sleep(float(check.start_interval_sec))
            on_tick()
            continue
        counted += 1
        if counted >= limit:
            return False, attempts
        on_tick()
        sleep(float(check.interval_sec))
        on_tick()
