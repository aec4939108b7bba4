"""The one trusted channel out of a sandbox (SPEC GYM-10): capped copies of a sandbox file or folder onto the host.

Bytes leave a sandbox only through a path no process inside it can write into or spoof:

- Docker: the engine's archive API (``GET /containers/<id>/archive``). The tar stream is produced by the engine
  from the container's filesystem; no process of the container takes part. `copy_tar_stream` reads it as a stream
  (never a whole member in memory, never spooled to disk beyond what is kept).
- local (bubblewrap): host-side reads beneath the sandbox's root (`copy_from_root`), every path component opened
  with ``O_NOFOLLOW`` relative to its parent's descriptor (``dir_fd`` walking), files first opened ``O_PATH`` and
  re-opened for reading only when ``fstat`` says they are regular, so a fifo never blocks and a device is never
  opened. No sandbox binary runs.

What lands on the host, whatever the sandbox holds:

- Names are relative to the copy's destination, without ``..`` or absolute parts; anything else is refused.
- Only folders and regular files are created on the host; files keep their permission bits (``& 0o777``: never
  setuid, setgid or sticky), owners are the calling user. Symbolic and hard links are recorded
  (`CopyReport.links`, name -> target) and never created nor followed; devices, fifos and sockets are recorded as
  refused (`CopyReport.refused`).
- Sizes are capped in real bytes read (`CopyBudget`): at most ``file_cap`` bytes per file (a longer file is cut and
  recorded truncated), at most ``turn_cap`` bytes per turn for all copies of the turn together (each entry costs
  512 bytes too, so a million empty files cannot amplify either). A sparse file costs what is read, not what it
  declares. Bytes skipped in an engine stream (the rest of a cut file) are bounded as well: a stream is abandoned
  after ``4 x turn_cap`` bytes (the copy is then `CopyReport.cut`).
- ``reserved`` names (the reward files) are read up to their own cap + 1 byte, outside the turn budget, so that
  large artifacts can never crowd a reward out; a reserved file over its cap is recorded truncated and not written.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

__all__ = ["CopyBudget", "CopiedFile", "CopyReport", "safe_relname", "copy_tar_stream", "copy_from_root"]

#: What each entry costs against the turn budget (a tar header's size), besides its data.
ENTRY_COST = 512
_CHUNK = 1 << 16


@dataclass
class CopyBudget:
    """Real bytes a turn may still copy out of its sandboxes (GYM-10). One per turn; not thread-safe.

    Attributes:
        file_cap: bytes kept per file.
        turn_cap: bytes kept per turn, all files and entries together.
        used: bytes charged so far.
    """

    file_cap: int
    turn_cap: int
    used: int = 0

    @property
    def left(self) -> int:
        return max(0, self.turn_cap - self.used)

    def stream_limit(self) -> int:
        """Bytes one engine stream may deliver (kept and skipped) before it is abandoned."""
        return 4 * self.turn_cap + (1 << 20)


@dataclass(frozen=True)
class CopiedFile:
    """One regular file written on the host: ``size`` bytes kept; ``truncated`` when the file was longer."""

    size: int
    truncated: bool = False


@dataclass
class CopyReport:
    """What one copy did. Names are relative to the copy's destination (``""`` is the source itself).

    Attributes:
        kind: what the source is: ``"directory"``, ``"file"``, ``"link"``, ``"other"`` (refused), ``None`` missing.
        files: regular files written on the host.
        links: symbolic (and hard) links found, name -> target; never created on the host, never followed.
        refused: names not copied, name -> why (``fifo``, ``device``, ``socket``, ``bad name``, ``budget``, ...).
        cut: the turn budget or the stream limit ended the copy before its end (later entries are missing).
        data: contents of the ``reserved`` files read (at most their cap + 1 byte each).
    """

    kind: str | None = None
    files: dict[str, CopiedFile] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    data: dict[str, bytes] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        """Something was left out for a cap: a file cut, a stream abandoned or an entry refused for the budget."""
        return self.cut or any(f.truncated for f in self.files.values()) or "budget" in self.refused.values()

    def is_empty(self) -> bool:
        """Nothing at all was found below the source."""
        return not (self.files or self.links or self.refused)


def safe_relname(name: str) -> str | None:
    """``name`` as a clean relative path (``""`` for the top), or ``None`` if it is absolute, climbs (``..``) or
    holds a NUL byte."""
    if "\0" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


class _Writer:
    """Writes kept files below ``dest`` (a host folder of ours: it never holds links)."""

    def __init__(self, dest: Path) -> None:
        self.dest = Path(dest)

    def path(self, rel: str) -> Path:
        return self.dest / rel if rel else self.dest

    def mkdir(self, rel: str) -> None:
        self.path(rel).mkdir(parents=True, exist_ok=True)

    def open(self, rel: str, mode: int) -> int:
        """A new file ``rel`` with the permission bits ``mode & 0o777`` (no setuid/setgid/sticky on the host)."""
        target = self.path(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.is_dir():
            raise OSError(errno.EEXIST, "a folder or link is in the way", str(target))
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, mode & 0o777)
        return fd


def _file_cap(rel: str, budget: CopyBudget, reserved: Mapping[str, int]) -> tuple[int, bool]:
    """(bytes to keep at most, charged to the turn budget)."""
    if rel in reserved:
        return reserved[rel] + 1, False
    return min(budget.file_cap, budget.left), True


def _finish_file(rep: CopyReport, rel: str, kept: int, more: bool, reserved: Mapping[str, int],
                 writer: _Writer, data: bytearray | None) -> None:
    if rel in reserved:
        over = kept > reserved[rel] or more
        rep.data[rel] = bytes(data or b"")
        if over:
            writer.path(rel).unlink(missing_ok=True)  # never truncated: an over-cap reward file is not kept
        rep.files[rel] = CopiedFile(kept, over)
        return
    rep.files[rel] = CopiedFile(kept, more)


# --- Docker: the engine's tar stream ------------------------------------------------------------------------
class _ChunkReader(io.RawIOBase):
    """A raw reader over an iterator of byte chunks that stops (EOF) after ``limit`` bytes and says so."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""
        self.total = 0
        self.limit = limit
        self.cut = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if not self._buf:
            if self.total >= self.limit:
                self.cut = True
                return 0
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.total += n
        return n


def copy_tar_stream(chunks: Iterable[bytes], dest: Path, budget: CopyBudget, *,
                    reserved: Mapping[str, int] | None = None) -> CopyReport:
    """Copy the members of the engine's tar stream ``chunks`` (``GET archive`` of one path) to ``dest``.

    The stream's first member is the source itself (named by its basename); it becomes ``dest`` (a folder's
    contents go into the folder ``dest``, a file becomes the file ``dest``). See the module docstring for what is
    written and what is refused. Reads the stream incrementally: memory stays at one chunk plus tar headers.
    """
    reserved = reserved or {}
    rep = CopyReport()
    writer = _Writer(dest)
    raw = _ChunkReader(chunks, budget.stream_limit())
    top: str | None = None
    try:
        with tarfile.open(fileobj=io.BufferedReader(raw, _CHUNK), mode="r|") as tar:
            for member in tar:
                name = member.name
                if top is None:
                    top = name.strip("/").split("/", 1)[0]
                first, _, rest = name.strip("/").partition("/")
                rel = safe_relname(rest) if first == top else None
                if rel is None:
                    rep.refused[name[:200]] = "bad name"
                    continue
                if rel == "" and rep.kind is None:
                    rep.kind = ("directory" if member.isdir() else "file" if member.isreg() else
                                "link" if (member.issym() or member.islnk()) else "other")
                if budget.used + ENTRY_COST > budget.turn_cap and rel not in reserved:
                    rep.refused[rel] = "budget"
                    rep.cut = True
                    break
                budget.used += ENTRY_COST
                if member.isdir():
                    writer.mkdir(rel)
                elif member.issym() or member.islnk():
                    rep.links[rel] = member.linkname
                elif member.isreg():
                    _copy_member(tar, member, rel, writer, budget, reserved, rep)
                else:
                    rep.refused[rel] = ("fifo" if member.isfifo() else "device" if member.isdev() else "special")
    except (tarfile.TarError, EOFError) as exc:
        if not raw.cut:
            from harbor_gym.errors import ArchiveError

            raise ArchiveError(f"the engine's archive could not be read: {exc}", path=dest, field="get") from exc
    rep.cut = rep.cut or raw.cut
    return rep


def _copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str, writer: _Writer, budget: CopyBudget,
                 reserved: Mapping[str, int], rep: CopyReport) -> None:
    cap, charged = _file_cap(rel, budget, reserved)
    try:
        fd = writer.open(rel, member.mode)
    except OSError:
        rep.refused[rel] = "name clash"
        return
    kept = 0
    data = bytearray() if rel in reserved else None
    try:
        src = tar.extractfile(member)
        while src is not None and kept < cap:
            chunk = src.read(min(_CHUNK, cap - kept))
            if not chunk:
                break
            os.write(fd, chunk)
            if data is not None:
                data += chunk
            kept += len(chunk)
    finally:
        os.close(fd)
    if charged:
        budget.used += kept
    _finish_file(rep, rel, kept, member.size > kept, reserved, writer, data)


# --- local: host-side reads beneath the sandbox's root --------------------------------------------------------
def copy_from_root(root_fd: int, src_parent_fd: int, base: str, dest: Path, budget: CopyBudget, *,
                   reserved: Mapping[str, int] | None = None) -> CopyReport:
    """Copy ``base`` (a name inside the folder ``src_parent_fd``, itself resolved inside the sandbox's root
    ``root_fd``) to ``dest``, opening every component with ``O_NOFOLLOW`` (see the module docstring).

    The caller owns both descriptors. Nothing below ``base`` is followed: a link is recorded, never opened.
    """
    reserved = reserved or {}
    rep = CopyReport()
    writer = _Writer(dest)
    try:
        fd = os.open(base, os.O_PATH | os.O_NOFOLLOW, dir_fd=src_parent_fd)
    except FileNotFoundError:
        return rep
    stack: list[tuple[int, str]] = [(fd, "")]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                if not _copy_entry(fd, rel, base if rel == "" else posixpath.basename(rel), writer, budget,
                                   reserved, rep, stack, src_parent_fd):
                    rep.cut = True
                    break
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
    return rep


def _copy_entry(fd: int, rel: str, name: str, writer: _Writer, budget: CopyBudget, reserved: Mapping[str, int],
                rep: CopyReport, stack: list[tuple[int, str]], parent_fd: int) -> bool:
    """Copy one entry opened ``O_PATH`` as ``fd``; push a folder's children. False: the budget is spent."""
    st = os.fstat(fd)
    if rel == "" and rep.kind is None:
        rep.kind = ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else
                    "link" if stat.S_ISLNK(st.st_mode) else "other")
    if budget.used + ENTRY_COST > budget.turn_cap and rel not in reserved:
        rep.refused[rel] = "budget"
        return False
    budget.used += ENTRY_COST
    if stat.S_ISLNK(st.st_mode):
        rep.links[rel] = os.readlink("", dir_fd=fd)  # readlinkat(fd, ""): the O_PATH link itself
    elif stat.S_ISDIR(st.st_mode):
        writer.mkdir(rel)
        dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY)
        try:
            names = sorted(os.listdir(dfd), reverse=True)
            for child in names:
                try:
                    cfd = os.open(child, os.O_PATH | os.O_NOFOLLOW, dir_fd=dfd)
                except FileNotFoundError:
                    continue
                stack.append((cfd, posixpath.join(rel, child) if rel else child))
        finally:
            os.close(dfd)
    elif stat.S_ISREG(st.st_mode):
        _copy_regular(fd, rel, writer, budget, reserved, rep, st.st_mode)
    else:
        rep.refused[rel] = ("fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
                            else "device")
    return True


def _copy_regular(fd: int, rel: str, writer: _Writer, budget: CopyBudget, reserved: Mapping[str, int],
                  rep: CopyReport, mode: int) -> None:
    cap, charged = _file_cap(rel, budget, reserved)
    try:
        out = writer.open(rel, mode)
    except OSError:
        rep.refused[rel] = "name clash"
        return
    data = bytearray() if rel in reserved else None
    kept, more = 0, False
    try:
        rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)  # the same inode, now readable
        try:
            while kept < cap:
                chunk = os.read(rfd, min(_CHUNK, cap - kept))
                if not chunk:
                    break
                os.write(out, chunk)
                if data is not None:
                    data += chunk
                kept += len(chunk)
            more = kept >= cap and bool(os.read(rfd, 1))
        finally:
            os.close(rfd)
    finally:
        os.close(out)
    if charged:
        budget.used += kept
    _finish_file(rep, rel, kept, more, reserved, writer, data)
