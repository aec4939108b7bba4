"""Safe host-side reads inside a local sandbox's root, and user names resolved from the sandbox's own passwd/group.

`open_in_root` resolves a sandbox path below a root folder (``/proc/<pid>/root``) the way the sandbox itself would:
absolute symlinks restart at the sandbox's root and ``..`` never climbs above it, one component at a time with
``O_NOFOLLOW`` so that a process inside cannot swap in a link that escapes. Nothing here follows a path on the host.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from harbor_gym.errors import SandboxError

__all__ = ["open_in_root", "read_in_root", "UserInfo", "resolve_user"]

_MAX_LINKS = 40


def open_in_root(root: str, path: str, *, flags: int = os.O_RDONLY) -> int:
    """Open ``path`` (absolute, inside the sandbox) below ``root``; the caller closes the returned fd.

    Raises:
        FileNotFoundError: a component is missing. OSError: anything else (too many links, not a folder).
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        fd = _walk(root_fd, path)
        try:
            return os.open(f"/proc/self/fd/{fd}", flags)
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)


def _walk(root_fd: int, path: str) -> int:
    """An O_PATH fd of ``path`` resolved inside ``root_fd`` (symlinks followed inside the root)."""
    stack = [root_fd]  # fds of the folders from the root down to the current one (index 0 is borrowed)
    parts = [p for p in path.split("/") if p and p != "."]
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=stack[-1])
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    os.close(fd)
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(part, dir_fd=stack[-1])
                os.close(fd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            stack.append(fd)
        return os.dup(stack[-1])
    finally:
        for fd in stack[1:]:
            os.close(fd)


def read_in_root(root: str, path: str, max_bytes: int) -> bytes | None:
    """The first ``max_bytes`` of the regular file ``path`` inside ``root``, or ``None`` if it is not one."""
    try:
        fd = open_in_root(root, path, flags=os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class UserInfo:
    """A user as the sandbox knows it: numeric ids, supplementary groups, home folder."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def _table(root: str, path: str) -> list[list[str]]:
    data = read_in_root(root, path, 16 << 20) or b""
    rows = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line and not line.startswith("#"):
            rows.append(line.split(":"))
    return rows


def resolve_user(root: str, user: str) -> UserInfo:
    """Resolve ``user`` (``"name"``, ``"uid"``, ``"name:group"``, ``"uid:gid"``) from the sandbox's /etc/passwd
    and /etc/group (never the host's).

    Raises:
        SandboxError: a name that the sandbox does not know.
    """
    name, _, group = user.partition(":")
    passwd = [r for r in _table(root, "/etc/passwd") if len(r) >= 7]
    row = next((r for r in passwd if r[0] == name), None)
    if row is None and name.isdigit():
        row = next((r for r in passwd if r[2] == name), None)
        if row is None:
            row = [name, "x", name, "0", "", "/", "/bin/sh"]  # as Docker: an unknown uid gets gid 0
    if row is None:
        raise SandboxError(f"no user {name!r} in the sandbox's /etc/passwd", field="user")
    uname, uid, gid, home = row[0], int(row[2]), int(row[3]), row[5] or "/"
    groups_rows = [r for r in _table(root, "/etc/group") if len(r) >= 3]
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            grow = next((r for r in groups_rows if r[0] == group), None)
            if grow is None:
                raise SandboxError(f"no group {group!r} in the sandbox's /etc/group", field="user")
            gid = int(grow[2])
    supplementary = [gid]
    if not group:
        for r in groups_rows:
            members = r[3].split(",") if len(r) > 3 and r[3] else []
            if uname in members and r[2].isdigit() and int(r[2]) not in supplementary:
                supplementary.append(int(r[2]))
    return UserInfo(name=uname, uid=uid, gid=gid, groups=tuple(supplementary), home=home)
