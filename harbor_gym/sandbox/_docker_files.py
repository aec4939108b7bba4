"""File transfer for a `DockerSandbox`: `DockerFilesMixin` (put/put_bytes/get/copy_out/read_file through tar archives).

``copy_out`` is the trusted channel out of the container (GYM-10): the engine's archive stream, read
incrementally under a `channel.CopyBudget` (see `harbor_gym.sandbox.channel`).

``put``/``put_bytes`` send one archive (owner and mode in its headers), ``get`` extracts the engine's archive
refusing escaping members, ``read_file`` reads only as much of the first member as needed (one engine
request).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox import archives, channel
from harbor_gym.sandbox._engine import translate_error

if TYPE_CHECKING:
    import docker

__all__ = ["DockerFilesMixin"]


class DockerFilesMixin:
    """Copying into, out of and reading from the container; mixed into `DockerSandbox`."""

    if TYPE_CHECKING:  # provided by `DockerSandbox`
        name: str
        _ids: tuple[str, str] | None

        @property
        def client(self) -> docker.DockerClient: ...
        def _count(self, n: int = 1) -> None: ...
        def _require_running(self) -> str: ...

    # --- files --------------------------------------------------------------------------------------------
    def _owner(self, owner: str | None) -> archives.Owner | None:
        if owner is None:
            return None
        user, group = archives.parse_owner(owner)
        if user.isdigit() and (group is None or group.isdigit()) and group is not None:
            return archives.Owner(int(user), int(group))
        for attempt in range(2):
            if self._ids is None or attempt == 1:
                passwd = self.read_file("/etc/passwd", max_bytes=1 << 22) or b""
                grp = self.read_file("/etc/group", max_bytes=1 << 22) or b""
                self._ids = (passwd.decode("utf-8", "replace"), grp.decode("utf-8", "replace"))
            found = archives.resolve_owner(owner, *self._ids)
            if found is not None:
                return found
        raise SandboxError(f"sandbox {self.name}: owner {owner!r} is not a user (and group) of the sandbox",
                           field="owner")

    def _put_archive(self, data: bytes, dest: str) -> None:
        cid = self._require_running()
        try:
            self.client.api.put_archive(cid, "/", data)
            self._count()
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"put {dest}", sandbox=self.name)

    def put(self, local: Path, dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        """Place the local file at ``dest`` or the local folder's contents into the folder ``dest`` (one archive;
        owner and mode in its headers; missing parents created root-owned, existing ones untouched)."""
        self._require_running()
        data = archives.tar_local_path(Path(local), dest, owner=self._owner(owner), mode=mode)
        self._put_archive(data, dest)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        """Write ``data`` as the file ``dest`` (parents created)."""
        self._require_running()
        self._put_archive(archives.tar_bytes(data, dest, owner=self._owner(owner), mode=mode), dest)

    def get(self, src: str, dest_dir: Path) -> Path:
        """Copy ``src`` into ``dest_dir/<basename>``; escaping members are refused (`ArchiveError`) before
        anything is written.

        Raises:
            SandboxPathError: ``src`` does not exist.
        """
        cid = self._require_running()
        try:
            stream, _stat = self.client.api.get_archive(cid, src, chunk_size=1 << 20)
            self._count()
            with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
                for chunk in stream:
                    spool.write(chunk)
                spool.seek(0)
                tops = archives.safe_extract(spool, Path(dest_dir))
        except (SandboxError, archives.ArchiveError):
            raise
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"get {src}", sandbox=self.name, path=src)
        name = tops[0] if tops else src.rstrip("/").rsplit("/", 1)[-1]
        return Path(dest_dir) / name

    def copy_out(self, src: str, dest: Path, *, budget: channel.CopyBudget,
                 reserved: dict[str, int] | None = None) -> channel.CopyReport:
        """GYM-10: copy ``src`` to the host path ``dest`` through the engine's archive API, capped by ``budget``
        (see `Sandbox.copy_out`). One engine request.

        Raises:
            SandboxPathError: ``src`` does not exist. SandboxError: the container is gone or the engine failed.
        """
        import docker.errors

        cid = self._require_running()
        try:
            stream, _stat = self.client.api.get_archive(cid, src, chunk_size=1 << 16)
        except docker.errors.NotFound as exc:
            self._count()
            if "no such container" in str(getattr(exc, "explanation", "") or exc).lower():
                translate_error(exc, what=f"copy {src}", sandbox=self.name)
            raise SandboxPathError(f"no such file or folder in sandbox {self.name}", path=src,
                                   field="copy_out") from exc
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"copy {src}", sandbox=self.name, path=src)
        self._count()
        try:
            return channel.copy_tar_stream(stream, Path(dest), budget, reserved=reserved)
        except SandboxError:
            raise
        except Exception as exc:
            translate_error(exc, what=f"copy {src}", sandbox=self.name, path=src)
        finally:
            if hasattr(stream, "close"):
                stream.close()

    def read_file(self, path: str, *, max_bytes: int, _hops: int = 0) -> bytes | None:
        """The first ``max_bytes`` bytes of the regular file ``path`` (a symlink is followed); ``None`` if it is
        missing or not a regular file. One engine request; reads only as much of the archive as needed."""
        import docker.errors

        cid = self._require_running()
        try:
            stream, stat = self.client.api.get_archive(cid, path, chunk_size=1 << 16)
        except docker.errors.NotFound as exc:
            self._count()
            if "no such container" in str(getattr(exc, "explanation", "") or exc).lower():
                translate_error(exc, what=f"read {path}", sandbox=self.name)
            return None
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"read {path}", sandbox=self.name, path=path)
        self._count()
        mode = int(stat.get("mode", 0))
        link = stat.get("linkTarget") or ""
        if mode & (1 << 27) and link and _hops < 8:
            stream.close() if hasattr(stream, "close") else None
            return self.read_file(link, max_bytes=max_bytes, _hops=_hops + 1)
        if mode & (1 << 31) or mode & (1 << 27) or mode & ((1 << 26) | (1 << 25) | (1 << 24) | (1 << 21)):
            stream.close() if hasattr(stream, "close") else None
            return None  # a folder, link, device, pipe or socket (Go's os.FileMode bits)
        size = int(stat.get("size", 0))
        want = 512 + min(size, max_bytes)
        buf = bytearray()
        try:
            for chunk in stream:
                buf += chunk
                if len(buf) >= want:
                    break
        except Exception as exc:
            translate_error(exc, what=f"read {path}", sandbox=self.name, path=path)
        finally:
            if hasattr(stream, "close"):
                stream.close()
        return _first_member_data(bytes(buf), max_bytes)


def _first_member_data(buf: bytes, max_bytes: int) -> bytes | None:
    """The data of the first member of a (possibly truncated) tar stream, up to ``max_bytes``."""
    import tarfile

    offset = 0
    # skip PAX / GNU long-name headers
    for _ in range(4):
        if len(buf) < offset + 512:
            return None
        header = buf[offset:offset + 512]
        kind = header[156:157]
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        if kind in (b"x", b"g", b"L", b"K"):
            offset += 512 + ((size + 511) // 512) * 512
            continue
        if kind not in (b"0", b"\0", b"7"):
            return None
        try:
            tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return None
        return buf[offset + 512: offset + 512 + min(size, max_bytes)]
    return None
