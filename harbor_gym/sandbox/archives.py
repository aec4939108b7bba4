"""Tar archives in and out of sandboxes: in-memory upload archives with owner and mode in the headers, and a
refusing extractor for downloads.

Uploads: one archive per `put`, rooted at ``/`` so that missing parent folders are created by the engine and existing
ones keep their owner and mode; owner and mode are written into the tar headers, so no ``chown`` exec is needed.

Downloads (`safe_extract`): every member is checked before anything is written. Absolute names, ``..`` components,
links whose target resolves outside the destination (following the archive's own links), hard links to names
outside the archive and device files are refused with `ArchiveError`; then the archive is extracted into a fresh
folder and moved into place. Modes are preserved; owners become the calling user.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping

from harbor_gym.errors import ArchiveError, SandboxError

__all__ = [
    "Owner",
    "parse_owner",
    "resolve_owner",
    "tar_local_path",
    "tar_bytes",
    "check_members",
    "safe_extract",
]


@dataclass(frozen=True)
class Owner:
    """Numeric owner written into tar headers."""

    uid: int
    gid: int


def parse_owner(owner: str) -> tuple[str, str | None]:
    """Split ``"user"``, ``"uid:gid"`` or ``"name:group"`` into (user, group or None)."""
    user, sep, group = owner.partition(":")
    if not user or (sep and not group):
        raise SandboxError(f"owner {owner!r} is not 'user', 'uid:gid' or 'name:group'", field="owner")
    return user, (group if sep else None)


def _table(text: str) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[0] and not line.startswith("#"):
            rows.setdefault(parts[0], parts)
    return rows


def resolve_owner(owner: str, passwd: str, group: str) -> Owner | None:
    """The numeric owner of ``owner`` given the sandbox's ``/etc/passwd`` and ``/etc/group`` texts.

    A numeric user without a group takes its passwd entry's group, else gid 0 (as Docker's ``--user`` does).
    Returns ``None`` when a name is not found (the caller may re-read the tables once and then refuse).
    """
    user, grp = parse_owner(owner)
    users = _table(passwd)
    if user.isdigit():
        uid = int(user)
        entry = next((row for row in users.values() if row[2] == user), None)
        default_gid = int(entry[3]) if entry and entry[3].isdigit() else 0
    else:
        row = users.get(user)
        if row is None or not row[2].isdigit():
            return None
        uid, default_gid = int(row[2]), int(row[3]) if row[3].isdigit() else 0
    if grp is None:
        return Owner(uid, default_gid)
    if grp.isdigit():
        return Owner(uid, int(grp))
    grow = _table(group).get(grp)
    if grow is None or not grow[2].isdigit():
        return None
    return Owner(uid, int(grow[2]))


def _member_name(dest: str) -> str:
    norm = posixpath.normpath("/" + dest.lstrip("/"))
    if not dest.startswith("/"):
        raise SandboxError(f"sandbox paths must be absolute, got {dest!r}", field="dest")
    return norm.lstrip("/")


def _own(info: tarfile.TarInfo, owner: Owner | None) -> tarfile.TarInfo:
    info.uid, info.gid = (owner.uid, owner.gid) if owner else (0, 0)
    info.uname = info.gname = ""
    return info


def tar_bytes(data: bytes, dest: str, *, owner: Owner | None, mode: int) -> bytes:
    """An archive (to be put at ``/``) holding ``data`` as the file ``dest``."""
    info = _own(tarfile.TarInfo(_member_name(dest)), owner)
    info.size = len(data)
    info.mode = mode & 0o7777
    info.mtime = int(time.time())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_local_path(local: Path, dest: str, *, owner: Owner | None, mode: int | None) -> bytes:
    """An archive (to be put at ``/``) that places the file ``local`` at ``dest``, or the folder ``local``'s
    contents into the folder ``dest``, keeping permission bits; ``owner`` on every entry (root when ``None``);
    ``mode`` on the file, or on the folder ``dest`` itself.

    Raises:
        SandboxError: ``local`` does not exist or is neither file nor folder.
    """
    local = Path(local)
    if not local.exists():
        raise SandboxError("no such local file or folder to upload", path=local, field="put")
    root = _member_name(dest)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if local.is_file():
            info = _own(tar.gettarinfo(str(local), arcname=root), owner)
            if mode is not None:
                info.mode = mode & 0o7777
            with open(local, "rb") as fh:
                tar.addfile(info, fh)
            return buf.getvalue()
        if not local.is_dir():
            raise SandboxError("only regular files and folders can be uploaded", path=local, field="put")
        if root:
            info = _own(tar.gettarinfo(str(local), arcname=root), owner)
            if mode is not None:
                info.mode = mode & 0o7777
            tar.addfile(info)
        for dirpath, dirnames, filenames in os.walk(local):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, local)
            for name in dirnames + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = posixpath.join(root, *([] if rel_dir == "." else rel_dir.split(os.sep)), name)
                info = _own(tar.gettarinfo(full, arcname=arc), owner)
                if info.isreg():
                    with open(full, "rb") as fh:
                        tar.addfile(info, fh)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
                # sockets, fifos and devices are not uploaded
    return buf.getvalue()


def _resolve_inside(parts: list[str], links: Mapping[str, str], depth: int = 0) -> list[str] | None:
    """Resolve the relative path ``parts`` through the archive's own symlinks; ``None`` if it leaves the root."""
    if depth > 40:
        return None
    out: list[str] = []
    for i, part in enumerate(parts):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        key = "/".join(out)
        if key in links:
            target = links[key]
            if target.startswith("/"):
                return None
            base = out[:-1]
            resolved = _resolve_inside(base + target.split("/"), links, depth + 1)
            if resolved is None:
                return None
            out = resolved
    return out


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Refuse an archive with a member that would escape the destination (see the module docstring).

    Raises:
        ArchiveError: naming the first offending member.
    """
    links: dict[str, str] = {}
    names = set()
    for m in members:
        name = m.name
        parts = name.split("/")
        if name.startswith("/") or ".." in parts:
            raise ArchiveError(f"archive member {name!r} escapes the destination (absolute or '..')", field="get")
        norm = "/".join(p for p in parts if p not in ("", "."))
        names.add(norm)
        if m.issym():
            links[norm] = m.linkname
        elif not (m.isreg() or m.isdir() or m.islnk()):
            raise ArchiveError(f"archive member {name!r} is a device, fifo or other special file", field="get")
    for m in members:
        norm = "/".join(p for p in m.name.split("/") if p not in ("", "."))
        parent = norm.split("/")[:-1]
        # the member's own folder must resolve inside (a link earlier in its path may point out)
        if _resolve_inside(parent, links) is None:
            raise ArchiveError(f"archive member {m.name!r} lies below a link that points outside", field="get")
        if m.issym():
            if m.linkname.startswith("/") or _resolve_inside(parent + m.linkname.split("/"), links) is None:
                raise ArchiveError(
                    f"archive member {m.name!r} is a link pointing outside the destination ({m.linkname!r})",
                    field="get",
                )
        elif m.islnk():
            target = "/".join(p for p in m.linkname.split("/") if p not in ("", "."))
            if m.linkname.startswith("/") or ".." in m.linkname.split("/") or target not in names:
                raise ArchiveError(f"archive member {m.name!r} is a hard link to {m.linkname!r} outside the archive",
                                   field="get")


def safe_extract(fileobj: IO[bytes], dest_dir: Path) -> list[str]:
    """Check every member of the tar stream ``fileobj``, then extract it into ``dest_dir``.

    Returns the top-level names placed in ``dest_dir``. After an `ArchiveError` nothing was written. Existing
    folders are merged (same names replaced).
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(fileobj=fileobj, mode="r:")
    except tarfile.TarError as exc:
        raise ArchiveError(f"not a tar archive: {exc}", path=dest_dir, field="get") from exc
    with tar:
        members = tar.getmembers()
        check_members(members)
        uid, gid = os.getuid(), os.getgid()
        for m in members:
            m.uid, m.gid, m.uname, m.gname = uid, gid, "", ""
            m.mode &= 0o777 if not m.isdir() else 0o7777
        staging = Path(tempfile.mkdtemp(prefix=".hg-get-", dir=dest_dir))
        try:
            kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extractall(staging, members=members, numeric_owner=True, **kwargs)
            tops = sorted({m.name.split("/")[0] for m in members if m.name.split("/")[0] not in ("", ".")})
            for top in tops:
                _move_into(staging / top, dest_dir / top)
            return tops
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _move_into(src: Path, dst: Path) -> None:
    if dst.is_symlink() or (dst.exists() and not (dst.is_dir() and src.is_dir() and not src.is_symlink())):
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        else:
            dst.unlink()
    if not dst.exists():
        os.rename(src, dst)
        return
    for child in src.iterdir():  # both are real folders: merge
        _move_into(child, dst / child.name)
    shutil.copymode(src, dst)
