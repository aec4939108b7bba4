"""Tar archives for the local backend: build one from host files, and check-then-extract one coming back.

`safe_extract` refuses (`ArchiveError`) an archive holding any member that would land outside the destination:
absolute names, ``..``, symlinks whose target is absolute or climbs out, hard links to outside names, device nodes.
The whole archive is checked before anything is written, so a refused archive writes nothing.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from pathlib import Path

from harbor_gym.errors import ArchiveError

__all__ = ["safe_extract", "tar_path", "tar_bytes"]


def _inside(name: str) -> bool:
    norm = posixpath.normpath(name)
    return not (name.startswith("/") or norm == ".." or norm.startswith("../"))


def check_members(members: list[tarfile.TarInfo], *, source: str) -> None:
    """Raise `ArchiveError` if any member would escape the folder it is extracted into."""
    for m in members:
        if not _inside(m.name):
            raise ArchiveError(f"archive member {m.name!r} escapes the destination", path=source)
        if m.isdev():
            raise ArchiveError(f"archive member {m.name!r} is a device node", path=source)
        if m.issym():
            if m.linkname.startswith("/") or not _inside(posixpath.join(posixpath.dirname(m.name), m.linkname)):
                raise ArchiveError(
                    f"archive member {m.name!r} is a link pointing out ({m.linkname!r})", path=source
                )
        elif m.islnk() and not _inside(m.linkname):
            raise ArchiveError(f"archive member {m.name!r} is a hard link to {m.linkname!r} outside", path=source)


def safe_extract(archive: Path, dest_dir: Path, *, source: str) -> None:
    """Extract ``archive`` into ``dest_dir`` after checking every member (modes kept; owners kept when root)."""
    try:
        with tarfile.open(archive, "r:") as tar:
            members = tar.getmembers()
            check_members(members, source=source)
            dest_dir.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest_dir, members=members, numeric_owner=True, filter="fully_trusted")
    except tarfile.TarError as exc:
        raise ArchiveError(f"unreadable archive: {exc}", path=source) from exc


def _owned(info: tarfile.TarInfo, uid: int, gid: int) -> tarfile.TarInfo:
    info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
    return info


def tar_path(local: Path, *, arcname: str, uid: int, gid: int, mode: int | None) -> bytes:
    """A tar of ``local`` (a file as ``arcname``; a folder's contents as members below ``arcname``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if local.is_dir():
            for root, dirs, files in os.walk(local):
                dirs.sort()
                rel_root = os.path.relpath(root, local)
                for name in sorted(dirs) + sorted(files):
                    full = os.path.join(root, name)
                    rel = os.path.normpath(os.path.join(arcname, rel_root, name))
                    info = _owned(tar.gettarinfo(full, arcname=rel), uid, gid)
                    if info.isreg():
                        with open(full, "rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
        else:
            info = _owned(tar.gettarinfo(str(local), arcname=arcname), uid, gid)
            if mode is not None:
                info.mode = mode
            with open(local, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def tar_bytes(data: bytes, *, arcname: str, uid: int, gid: int, mode: int) -> bytes:
    """A tar holding one regular file ``arcname`` with ``data``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = _owned(tarfile.TarInfo(arcname), uid, gid)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
