"""Host log folders of an episode (SPEC TURN-11, ART-4, DIFF-13): under ``EnvConfig.logs_root`` (kept, paths in
the results) or in a temporary folder removed at close (no paths handed out).

A temporary folder is named ``harbor-gym-logs-<run_id>-<pid>-<task>-<random>`` (`TEMP_PREFIX`; the run is the
process's lease, `harbor_gym.sandbox.lease`). A process killed with SIGKILL never closes its episodes, so the first
temporary folder a process makes (and ``harbor-gym gc``) removes, with `reap_stale_temp_logs`, every such folder of
this user whose owning process is gone and whose run's lease is not live (issue 12 item 6).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from harbor_gym.sandbox.lease import lease_is_live, process_lease

__all__ = ["EpisodeLogs", "TurnDirs", "TEMP_PREFIX", "reap_stale_temp_logs"]

log = logging.getLogger("harbor_gym.episode")

#: Name prefix of an episode's temporary log folder (in the system's temporary folder).
TEMP_PREFIX = "harbor-gym-logs-"
_TEMP_NAME = re.compile(r"^harbor-gym-logs-([A-Za-z0-9]+)-(\d+)-")
#: A run's lease file renewed within this many seconds counts as live (renewals come every 5 s at most).
_LIVE_LEASE_S = 15.0
_reaped_once = False
_reap_lock = threading.Lock()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def reap_stale_temp_logs(directory: Path | None = None) -> list[Path]:
    """Remove the temporary episode log folders (`TEMP_PREFIX`) in ``directory`` (default: the system's temporary
    folder) that belong to this user, whose owning process is gone and whose run's lease is not live. A folder of
    a live process, of a live run, of another user, or a symlink is never touched. Returns the removed folders;
    never raises (a folder that cannot be removed is logged and kept)."""
    base = Path(directory or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        match = _TEMP_NAME.match(name)
        if match is None:
            continue
        path = base / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        run_id, pid = match.group(1), int(match.group(2))
        if _process_alive(pid) or lease_is_live(run_id, _LIVE_LEASE_S):
            continue
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as exc:
            log.warning("cannot remove the stale temporary log folder %s: %s", path, exc)
    return removed


def _reap_once_per_process() -> None:
    global _reaped_once
    with _reap_lock:
        if _reaped_once:
            return
        _reaped_once = True
    removed = reap_stale_temp_logs()
    if removed:
        log.info("removed %d temporary log folders of dead runs", len(removed))


@dataclass(frozen=True)
class TurnDirs:
    """One turn's host folders: ``turn`` holds ``verifier/`` and ``agent/``; ``artifacts`` per ART-4/DIFF-13."""

    turn: Path
    verifier: Path
    agent: Path
    artifacts: Path


class EpisodeLogs:
    """The episode's host log folder. ``close()`` removes it unless it lives under ``logs_root``."""

    def __init__(self, logs_root: str | None, task_id: str) -> None:
        self.kept = logs_root is not None
        if logs_root is not None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.root = Path(logs_root) / task_id / f"{stamp}-{uuid.uuid4().hex[:8]}"
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            _reap_once_per_process()
            run_id = process_lease().run_id
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_id)[:40]
            self.root = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{run_id}-{os.getpid()}-{safe}-"))
        self._closed = False

    def turn(self, step_name: str, *, multi_step: bool, harbor: bool) -> TurnDirs:
        """TURN-11: ``steps/<name>/verifier/`` and ``steps/<name>/agent/`` (single-step: ``verifier/``, ``agent/``);
        artifacts in the verifier folder's ``artifacts/`` under both semantics (DIFF-13 keeps the Seed side)."""
        base = self.root / "steps" / step_name if multi_step else self.root
        verifier, agent = base / "verifier", base / "agent"
        artifacts = verifier / "artifacts"
        for d in (verifier, agent):
            d.mkdir(parents=True, exist_ok=True)
        return TurnDirs(base, verifier, agent, artifacts)

    def public(self, path: Path) -> str | None:
        """``str(path)`` when logs are kept, else ``None`` (temporary folders are never handed out)."""
        return str(path) if self.kept else None

    def close(self) -> None:
        """Remove the temporary folder (idempotent); kept logs stay."""
        if self._closed:
            return
        self._closed = True
        if not self.kept:
            shutil.rmtree(self.root, ignore_errors=True)
