"""File transfer for a local sandbox: `LocalFilesMixin`, the put/put_bytes/get/read_file of `LocalSandbox`.

``put``/``put_bytes``/``get`` move archives through the sandbox's own ``tar`` run as root; ``read_file`` and
``copy_out`` (the trusted channel out of the sandbox, GYM-10) read from the host beneath the sandbox's root, every
component opened with ``O_NOFOLLOW`` relative to its parent (no sandbox binary runs, no link is followed out).
The engine uses ``copy_out`` only; ``get`` is kept for callers that want links recreated. Owners are resolved from
the sandbox's /etc/passwd and /etc/group, never the host's.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox import archives, channel
from harbor_gym.sandbox.local import _rootfs
from harbor_gym.sandbox.local._exec import _abs

__all__ = ["LocalFilesMixin"]

_MISSING_EXIT = 44


class LocalFilesMixin:
    """Copying into, out of and reading from the sandbox; mixed into `LocalSandbox` after `LocalExecMixin`."""

    if TYPE_CHECKING:  # provided by `LocalSandbox` / `LocalExecMixin`
        name: str

        def _require_running(self) -> int: ...
        def _raw(
            self, command: Sequence[str], *, stdin: bytes | None = None, timeout: float = 600.0,
            stdout_cap: int = ...,
        ) -> tuple[int, Path, str]: ...

    # --- files -------------------------------------------------------------------------------------------
    def _owner(self, owner: str | None) -> archives.Owner | None:
        if owner is None:
            return None
        root = f"/proc/{self._require_running()}/root"
        passwd = (_rootfs.read_in_root(root, "/etc/passwd", 16 << 20) or b"").decode(errors="replace")
        group = (_rootfs.read_in_root(root, "/etc/group", 16 << 20) or b"").decode(errors="replace")
        resolved = archives.resolve_owner(owner, passwd, group)
        if resolved is None:
            raise SandboxError(f"owner {owner!r} is unknown to local sandbox {self.name}", field="owner")
        return resolved

    def _untar(self, archive: bytes, *, what: str) -> None:
        """Extract an archive rooted at ``/`` inside the sandbox, as root, with the sandbox's own tar."""
        code, out, err = self._raw(["tar", "-x", "--numeric-owner", "-p", "-f", "-", "-C", "/"], stdin=archive,
                                   stdout_cap=1 << 16)  # tar -x prints nothing we need (GYM-10: bounded)
        out.unlink(missing_ok=True)
        if code != 0:
            raise SandboxError(
                f"copying into local sandbox {self.name} failed (exit {code}): {err}",
                path=what, field="put",
            )

    def put(self, local: Path, dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        """Copy a local file to ``dest`` or a local folder's contents into the folder ``dest`` (see `Sandbox.put`).

        Raises:
            SandboxError: ``local`` is missing, ``owner`` is unknown, or the copy failed.
        """
        dest = _abs(dest)
        archive = archives.tar_local_path(Path(local), dest, owner=self._owner(owner), mode=mode)
        self._untar(archive, what=dest)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        """Write ``data`` as the file ``dest`` (parents created)."""
        dest = _abs(dest)
        self._untar(archives.tar_bytes(data, dest, owner=self._owner(owner), mode=mode), what=dest)

    def get(self, src: str, dest_dir: Path) -> Path:
        """Copy ``src`` into ``dest_dir/<basename>`` (see `Sandbox.get`).

        Raises:
            SandboxPathError: ``src`` does not exist. ArchiveError: a member would escape ``dest_dir``.
        """
        parent, base = _split(_abs(src))
        script = f'cd -- "$1" 2>/dev/null && {{ [ -e "$2" ] || [ -L "$2" ]; }} || exit {_MISSING_EXIT}; ' \
                 'exec tar -c --numeric-owner -f - -- "$2"'
        code, archive, err = self._raw(["/bin/sh", "-c", script, "sh", parent, base])
        try:
            if code == _MISSING_EXIT:
                raise SandboxPathError(f"no such file or folder in local sandbox {self.name}", path=src, field="get")
            if code != 0:
                raise SandboxError(f"reading {src} from local sandbox {self.name} failed (exit {code}): "
                                   f"{err}", path=src, field="get")
            with open(archive, "rb") as fh:
                archives.safe_extract(fh, Path(dest_dir))
        finally:
            archive.unlink(missing_ok=True)
        return Path(dest_dir) / base

    def copy_out(self, src: str, dest: Path, *, budget: channel.CopyBudget,
                 reserved: dict[str, int] | None = None) -> channel.CopyReport:
        """GYM-10: copy ``src`` to the host path ``dest`` by host-side reads beneath the sandbox's root (see
        `Sandbox.copy_out`). The folders above ``src`` resolve inside the root the way the sandbox sees them
        (a link there restarts at the sandbox's root, never the host's); ``src`` itself and everything below it
        are opened with ``O_NOFOLLOW`` only.

        Raises:
            SandboxPathError: ``src`` does not exist. SandboxError: the sandbox is not running or a read failed.
        """
        pid = self._require_running()
        parent, base = _split(_abs(src))
        root = f"/proc/{pid}/root"
        try:
            root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            raise SandboxError(f"local sandbox {self.name} is gone: {exc}", path=src, field="copy_out",
                               retryable=True) from exc
        try:
            try:
                parent_fd = _rootfs.open_in_root(root, parent, flags=os.O_PATH | os.O_DIRECTORY)
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise SandboxPathError(f"no such file or folder in local sandbox {self.name}", path=src,
                                       field="copy_out") from exc
            try:
                report = channel.copy_from_root(root_fd, parent_fd, base, Path(dest), budget, reserved=reserved)
            finally:
                os.close(parent_fd)
        except OSError as exc:
            raise SandboxError(f"cannot copy {src} out of local sandbox {self.name}: {exc}", path=src,
                               field="copy_out") from exc
        finally:
            os.close(root_fd)
        if report.kind is None:
            raise SandboxPathError(f"no such file or folder in local sandbox {self.name}", path=src, field="copy_out")
        return report

    def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` of the regular file ``path`` (``None`` if it is not one), read from the host
        through the sandbox's root without following any link out of it."""
        pid = self._require_running()
        try:
            return _rootfs.read_in_root(f"/proc/{pid}/root", _abs(path), max_bytes)
        except OSError as exc:
            raise SandboxError(f"cannot read {path} in local sandbox {self.name}: {exc}", path=path,
                               field="read_file") from exc


def _split(path: str) -> tuple[str, str]:
    parent, base = posixpath.split(path.rstrip("/") or "/")
    if not base:
        raise SandboxPathError("a file path is needed, not the root folder", path=path)
    return parent or "/", base
