"""Working state of one turn (`_Turn`, `_timed`), the TURN-8 failure kinds and the engine's exec bounds.

Shared by the phase modules of the turn engine (`_seed`, `_prepare`, `_activate`, `_collect`, `_verify`)
and `_engine`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from harbor_gym.agents import AgentOutcome
from harbor_gym.episode._logs import TurnDirs
from harbor_gym.episode._records import ManifestEntry
from harbor_gym.episode._rewards import RewardReading
from harbor_gym.episode._shell import Script
from harbor_gym.episode._stop import ENGINE_ERROR_KIND
from harbor_gym.sandbox.channel import CopyBudget
from harbor_gym.task import Step

__all__ = ["SETUP_FAILED", "WORKDIR_FAILED", "HEALTHCHECK_FAILED", "ENGINE_ERROR_KIND", "one_line", "workdir_cause"]

SETUP_FAILED = "harbor:step_setup_failed"
WORKDIR_FAILED = "harbor:step_workdir_failed"
HEALTHCHECK_FAILED = "harbor:step_healthcheck_failed"

#: Bound of the engine's own housekeeping execs (clean-up, staging); the deadline may cut it shorter.
_HOUSEKEEPING_S = 120.0
_VERIFIER_TOOLS = ("bash", "timeout", "tar", "gzip", "find")


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs folded to one space), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def workdir_cause(workdir: str, stdout: str, marker: str) -> str:
    """TURN-8 ``workdir_failed``: the cause, with tar's last complaint from the housekeeping output if any."""
    lines = [line for line in stdout.splitlines() if line.strip() and marker not in line]
    detail = f": {one_line(lines[-1], 200)}" if lines else ""
    return f"workdir/ could not be written over {workdir}{detail}"


def _is_root(user: str | None) -> bool:
    return user is None or user.split(":")[0] in ("root", "0")


@dataclass
class _Turn:
    """Mutable working state of one turn (internal)."""

    step: Step
    index: int
    dirs: TurnDirs
    instruction: str
    mode: str
    agent: Any
    timings: dict[str, float] = field(default_factory=dict)
    outcome: AgentOutcome | None = None
    manifest: tuple[ManifestEntry, ...] = ()
    reading: RewardReading | None = None
    verified: bool = False
    verifier_timed_out: bool = False
    masked: bool = False
    mask_reason: str | None = None
    prep_kind: str | None = None
    engine_error: bool = False
    #: What went wrong, in a few words without the task or step (the engine prefixes them; no env values).
    cause: str | None = None
    #: The phase running now (``prepare``, ``agent``, ``artifacts``, ``verify``), for the deadline's message.
    phase: str | None = None
    prelude: Script | None = None
    prelude_stdin: bytes | None = None
    art_snapshot: bool = False
    #: GYM-11: the processes a shared-mode freeze exempted (services).
    freeze_exempt: tuple = ()
    #: GYM-11: how many processes this turn's freeze stopped (its `frozen` note); None: not noted.
    frozen_count: int | None = None
    #: GYM-12: the turn's outage was caused by the agent, and how.
    agent_caused: bool = False
    outage_cause: str | None = None
    #: GYM-12: a command of the activation lost the harness's exec wrapper (``kill -9 -1``).
    harness_killed: bool = False
    #: GYM-10: what this turn may still copy out of its sandboxes (set by `copy_budget`).
    budget: CopyBudget | None = None
    #: Issue 18: the model calls the capture proxy recorded in this turn's activation window, and how many calls
    #: it refused in the window.
    proxy_calls: tuple = ()
    proxy_refused: int = 0

    def copy_budget(self, config: Any) -> CopyBudget:
        """The turn's `CopyBudget` (``EnvConfig.copy_file_cap_bytes`` per file, ``copy_turn_cap_bytes`` in all),
        shared by its artifact copies and its verifier logs."""
        if self.budget is None:
            self.budget = CopyBudget(file_cap=config.copy_file_cap_bytes, turn_cap=config.copy_turn_cap_bytes)
        return self.budget


class _timed:
    """Context manager adding the block's duration to ``t.timings[name]``."""

    def __init__(self, t: _Turn, name: str) -> None:
        self.t, self.name = t, name

    def __enter__(self) -> None:
        self.t.phase = self.name
        self.start = time.monotonic()

    def __exit__(self, *exc: Any) -> None:
        self.t.timings[self.name] = self.t.timings.get(self.name, 0.0) + time.monotonic() - self.start
