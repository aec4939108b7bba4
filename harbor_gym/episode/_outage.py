"""GYM-12: whether a turn's outage was caused by the agent (`agent_outage_cause`), and the watched exec that tells
when an activation killed the harness's own processes (`WatchedExec`).

A turn's outage is agent-caused when, at any point from the episode's first activation to its end (the next turn's
clean-up included), the engine still answers and the sandbox died, was OOM-killed, exceeded its storage or can no
longer run commands; or when an activation killed the exec wrapper the harness runs its commands under (what
``kill -9 -1`` by a non-root agent does; by root it also ends the container's main process, and the sandbox dies).
An unreachable or restarted engine, a lease the host let lapse and a sandbox this process stopped are never
agent-caused. The evidence comes from the backend (`DockerSandbox.outage_report`: engine ping, container state, the
engine's own die/oom events, a probe command; `storage_exceeded()`), never from text a sandbox process prints.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from harbor_gym.sandbox.base import ExecResult, SandboxState

__all__ = ["agent_outage_cause", "WatchedExec", "STORAGE_EXCEEDED_KIND", "HARNESS_KILLED"]

_log = logging.getLogger("harbor_gym.episode")

#: The failure kind of a turn whose sandbox exceeded its storage (GYM-10); always agent-caused.
STORAGE_EXCEEDED_KIND = "harbor_gym:storage_exceeded"
#: ``outage_cause`` of an activation that killed the harness's exec wrapper.
HARNESS_KILLED = "harness_killed"
_PROBE_S = 10.0


def _storage_exceeded(sb: Any) -> bool:
    check = getattr(sb, "storage_exceeded", None)
    if not callable(check):
        return False
    try:
        return bool(check())
    except Exception:  # a check that cannot run is no evidence
        return False


def _stopped(sb: Any) -> bool:
    try:
        return getattr(sb, "state", None) is SandboxState.STOPPED
    except Exception:
        return False


def agent_outage_cause(sb: Any) -> str | None:
    """GYM-12: why the agent's sandbox ``sb`` failed, when its own processes are to blame; ``None`` otherwise.

    Uses the backend's ``outage_report()`` where it has one (Docker); elsewhere (the local backend, which has no
    engine) a sandbox that no longer runs and that we did not stop ``died``, and a live one that cannot run
    ``true`` as root ``cannot_run_commands``. Never raises.
    """
    if sb is None or _stopped(sb):  # a sandbox this process stopped (close, a pool's retire) never counts
        return None
    if _storage_exceeded(sb):
        return "storage_exceeded"
    report = getattr(sb, "outage_report", None)
    if callable(report):
        try:
            cause = report()
        except Exception:
            return None
        return None if _stopped(sb) else cause
    try:
        if not sb.is_alive():
            return "died"
        res = sb.exec(["true"], timeout=_PROBE_S, user="root", cwd="/")
    except Exception:
        return None if _stopped(sb) else "cannot_run_commands"
    return None if res.ok or _stopped(sb) else "cannot_run_commands"


class WatchedExec:
    """The activation's ``exec`` (``Turn._exec_fn``): ``sb.exec`` that remembers whether any of its commands lost
    the harness's wrapper (`ExecResult.wrapper_lost`: a process of the sandbox killed it)."""

    def __init__(self, exec_fn: Callable[..., ExecResult]) -> None:
        self._exec_fn = exec_fn
        self.wrapper_lost = False

    def __call__(self, *args: Any, **kwargs: Any) -> ExecResult:
        res = self._exec_fn(*args, **kwargs)
        if getattr(res, "wrapper_lost", False):
            _log.info("an activation command lost the harness's exec wrapper (kill -9 -1?)")
            self.wrapper_lost = True
        return res
