"""In-memory tar archives of task files for one upload per phase (TURN-4, ORACLE-1, VER-5, VER-6).

Archives hold file entries (and empty folders) only, never entries for folders that may already exist, so that
extracting them never re-owns or re-modes a folder an earlier turn left (USR-2). Every entry is owned by uid 0/gid 0
and keeps its permission bits (TURN-4); setuid/setgid bits can be cleared (VER-5).
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
import time
from pathlib import Path
from typing import Iterable

from harbor_gym.task import upload_listing

__all__ = ["ArchiveBuilder", "STAGE_DIR"]

#: Root-only folder inside every sandbox where archives are staged before one exec extracts them.
STAGE_DIR = "/.harbor_gym"


class ArchiveBuilder:
    """Collects files under absolute sandbox paths and renders one tar (members relative to ``/``)."""

    def __init__(self) -> None:
        self._members: dict[str, tuple[Path | None, bytes | None, int]] = {}
        self._dirs: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._members or self._dirs)

    def add_file(self, local: Path, dest: str, *, mode: int | None = None, clear_setid: bool = False) -> None:
        """Add the local file ``local`` (a symlink is followed) at the absolute sandbox path ``dest``."""
        perm = stat.S_IMODE(os.stat(local).st_mode) if mode is None else mode
        if clear_setid:
            perm &= ~(stat.S_ISUID | stat.S_ISGID)
        self._members[_rel(dest)] = (local, None, perm)

    def add_bytes(self, data: bytes, dest: str, *, mode: int = 0o644) -> None:
        """Add ``data`` as the file ``dest``."""
        self._members[_rel(dest)] = (None, data, mode)

    def add_dir(self, dest: str, *, mode: int = 0o755) -> None:
        """Add an (empty) folder entry at ``dest``: created if missing; an existing folder takes ``mode``."""
        self._dirs[_rel(dest)] = mode

    def add_tree(self, folder: Path, dest: str, *, honour_ignore: bool, root: Path | None = None,
                 clear_setid: bool = False, modes: dict[str, int] | None = None) -> list[str]:
        """Add every file of ``folder`` (``.harborignore`` honoured when asked, FMT-16) under ``dest``; empty
        sub-folders become folder entries. Returns the relative paths added."""
        listing = upload_listing(folder, root=root, honour_ignore=honour_ignore)
        added = []
        for local, rel in listing:
            self.add_file(local, posixpath.join(dest, rel), clear_setid=clear_setid,
                          mode=(modes or {}).get(rel))
            added.append(rel)
        for dirpath, dirnames, filenames in os.walk(folder):
            if not dirnames and not filenames and Path(dirpath) != Path(folder):
                rel = os.path.relpath(dirpath, folder).replace(os.sep, "/")
                self.add_dir(posixpath.join(dest, rel), mode=stat.S_IMODE(os.stat(dirpath).st_mode))
        return added

    def add_artifact_tree(self, folder: Path, dest: str) -> None:
        """VER-5: a collected artifact folder at ``dest``: setuid/setgid cleared; symlinks leaving it dropped
        (symlinks inside it are followed and uploaded as files)."""
        base = Path(folder).resolve()
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            for name in list(dirnames):
                full = Path(dirpath) / name
                if full.is_symlink():
                    dirnames.remove(name)
            for name in filenames:
                full = Path(dirpath) / name
                target = full.resolve()
                if full.is_symlink() and not (target == base or base in target.parents):
                    continue
                if not target.is_file():
                    continue
                rel = full.relative_to(folder).as_posix()
                self.add_file(target, posixpath.join(dest, rel), clear_setid=True)

    def paths(self) -> Iterable[str]:
        """Absolute sandbox paths of the file entries."""
        return ("/" + m for m in self._members)

    def render(self) -> bytes:
        """The tar archive (members relative to ``/``, root-owned)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, mode in sorted(self._dirs.items()):
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
                tar.addfile(info)
            now = int(time.time())
            for name, (local, data, mode) in sorted(self._members.items()):
                info = tarfile.TarInfo(name)
                info.mode = mode
                info.mtime = int(os.stat(local).st_mtime) if local is not None else now
                if local is not None:  # streamed into the archive: one copy in memory, not two (GYM-10 caps)
                    with open(local, "rb") as fh:
                        info.size = os.fstat(fh.fileno()).st_size
                        tar.addfile(info, fh)
                    continue
                payload = data or b""
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        return buf.getvalue()


def _rel(dest: str) -> str:
    if not dest.startswith("/"):
        raise ValueError(f"sandbox paths are absolute, got {dest!r}")
    return posixpath.normpath(dest).lstrip("/")
