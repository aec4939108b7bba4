"""Host log folders of an episode (SPEC TURN-11, ART-4, DIFF-13): under ``EnvConfig.logs_root`` (kept, paths in
the results) or in a temporary folder removed at close (no paths handed out)."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EpisodeLogs", "TurnDirs"]


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
            self.root = Path(tempfile.mkdtemp(prefix=f"harbor-gym-{task_id}-"))
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
