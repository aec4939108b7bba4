"""`JsonlFile`: append-only JSON Lines with atomic appends, and `RolloutFiles`, the pair of files a run writes.

Guarantee: a row is either wholly in the file or not at all. Each append is one ``os.write`` of the whole line
(newline included) on an ``O_APPEND`` descriptor, followed by ``fsync``; a short write (disk full) is cut back
with ``ftruncate``. A torn last line left by a crash outside our control (power loss) is dropped when the file is
next opened for appending, and skipped with a warning when read.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel

__all__ = ["JsonlFile", "RolloutFiles", "ROLLOUTS_FILE", "FAILURES_FILE"]

ROLLOUTS_FILE = "rollouts.jsonl"
FAILURES_FILE = "rollouts_failures.jsonl"

_log = logging.getLogger("harbor_gym.run")


class JsonlFile:
    """One JSON Lines file: `append` writes a whole row atomically; `rows` reads back every complete row."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._repaired = False

    def _repair_tail(self) -> None:
        """Cut a trailing partial line (no final newline) so that the next row starts on a fresh line."""
        if self._repaired:
            return
        self._repaired = True
        try:
            with open(self.path, "rb+") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                if size == 0:
                    return
                fh.seek(size - 1)
                if fh.read(1) == b"\n":
                    return
                fh.seek(0)
                data = fh.read()
                keep = data.rfind(b"\n") + 1
                _log.warning("%s: dropping a torn last line (%d bytes)", self.path, size - keep)
                fh.truncate(keep)
        except FileNotFoundError:
            return

    def append(self, row: BaseModel | dict[str, Any]) -> None:
        """Append ``row`` as one line, atomically (see the module docstring). Thread-safe.

        Raises:
            OSError: the write failed; the file is left as it was before the call.
        """
        data = row.model_dump(mode="json") if isinstance(row, BaseModel) else row
        line = (json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_tail()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                before = os.fstat(fd).st_size
                written = os.write(fd, line)
                if written != len(line):
                    os.ftruncate(fd, before)
                    raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes); row not written")
                os.fsync(fd)
            finally:
                os.close(fd)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every complete row, in file order; a torn or unparsable line is skipped with a warning."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        lines = raw.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                _log.warning("%s:%d: skipping a line that is not a complete JSON row", self.path, number)
                continue
            if isinstance(row, dict):
                yield row


class RolloutFiles:
    """The two files of a results folder: ``rollouts.jsonl`` (graded episodes) and ``rollouts_failures.jsonl``
    (episodes that ended ungraded or masked, tasks that failed to load)."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.out_dir = Path(out_dir)
        self.rollouts = JsonlFile(self.out_dir / ROLLOUTS_FILE)
        self.failures = JsonlFile(self.out_dir / FAILURES_FILE)

    def write(self, row: BaseModel) -> None:
        """Append ``row`` to the file its type belongs to (`RolloutRow` -> rollouts, else failures)."""
        from harbor_gym.run.rows import RolloutRow

        (self.rollouts if isinstance(row, RolloutRow) else self.failures).append(row)

    def done_keys(self) -> set[tuple[str, int]]:
        """``(task_id, rollout)`` of every episode already written to either file (resume skips them)."""
        keys: set[tuple[str, int]] = set()
        for file in (self.rollouts, self.failures):
            for row in file.rows():
                task, rollout = row.get("task_id"), row.get("rollout")
                if isinstance(task, str) and isinstance(rollout, int):
                    keys.add((task, rollout))
        return keys
