"""archives: the refusing download check (absolute, '..', links out, through links, hard links, devices), the
merge into place, upload archives with owner/mode in the headers, and owner resolution. No Docker needed."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from harbor_gym.errors import ArchiveError
from harbor_gym.sandbox import archives


def _tar(*members: tuple[str, str, str]) -> io.BytesIO:
    """members: (name, kind, arg) with kind in file/dir/sym/lnk/dev; arg = content or link target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, arg in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = arg.encode()
                info.size = len(data)
                info.mode = 0o640
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE,
                         "dev": tarfile.CHRTYPE}[kind]
            info.linkname = arg
            info.mode = 0o640 if kind == "lnk" else 0o755  # a hard link shares its target's mode
            tar.addfile(info)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    "members",
    [
        [("/etc/passwd", "file", "x")],
        [("a/../../x", "file", "x")],
        [("a", "dir", ""), ("a/l", "sym", "/etc/passwd")],
        [("a", "dir", ""), ("a/l", "sym", "../../outside")],
        [("a", "dir", ""), ("a/x", "sym", ".."), ("a/y", "sym", "x/..")],  # escapes only through a link
        [("a", "dir", ""), ("a/l", "sym", ".."), ("a/l/../evil", "file", "x")],
        [("a", "dir", ""), ("a/up", "sym", "../.."), ("a/up/evil", "file", "x")],
        [("a", "dir", ""), ("a/h", "lnk", "etc/passwd")],
        [("a", "dir", ""), ("a/dev", "dev", "")],
    ],
)
def test_escaping_archives_are_refused_before_anything_is_written(members, tmp_path):
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError):
        archives.safe_extract(_tar(*members), dest)
    assert list(dest.iterdir()) == []


def test_inside_links_modes_and_merge(tmp_path):
    dest = tmp_path / "dest"
    (dest / "a").mkdir(parents=True)
    (dest / "a" / "old.txt").write_text("kept")
    tops = archives.safe_extract(
        _tar(("a", "dir", ""), ("a/f.txt", "file", "new"), ("a/l", "sym", "f.txt"), ("a/h", "lnk", "a/f.txt"),
             ("a/sub", "dir", ""), ("a/sub/back", "sym", "../f.txt")),
        dest,
    )
    assert tops == ["a"]
    assert (dest / "a" / "old.txt").read_text() == "kept"
    assert (dest / "a" / "l").read_text() == "new" and (dest / "a" / "sub" / "back").read_text() == "new"
    assert stat.S_IMODE(os.stat(dest / "a" / "f.txt").st_mode) == 0o640
    assert [p.name for p in dest.iterdir()] == ["a"]  # no staging folder left


def test_upload_archive_carries_owner_and_modes(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "x.sh").write_text("x")
    (src / "x.sh").chmod(0o700)
    data = archives.tar_local_path(src, "/app/dst", owner=archives.Owner(1000, 1001), mode=0o770)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        by_name = {m.name: m for m in tar.getmembers()}
    assert set(by_name) == {"app/dst", "app/dst/sub", "app/dst/x.sh"}  # parents left to the engine
    assert by_name["app/dst"].mode == 0o770 and by_name["app/dst/x.sh"].mode == 0o700
    assert all((m.uid, m.gid) == (1000, 1001) for m in by_name.values())
    one = archives.tar_bytes(b"hi", "/a/b", owner=None, mode=0o600)
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        (m,) = tar.getmembers()
    assert (m.name, m.mode, m.uid, m.size) == ("a/b", 0o600, 0, 2)


PASSWD = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
GROUP = "root:x:0:\nagent:x:1000:\nstaff:x:50:agent\n"


@pytest.mark.parametrize(
    "owner, expected",
    [("agent", (1000, 1000)), ("agent:staff", (1000, 50)), ("1000:7", (1000, 7)), ("65534", (65534, 65534)),
     ("4242", (4242, 0)), ("root:50", (0, 50))],
)
def test_resolve_owner(owner, expected):
    found = archives.resolve_owner(owner, PASSWD, GROUP)
    assert (found.uid, found.gid) == expected


def test_resolve_owner_unknown_names_give_none():
    assert archives.resolve_owner("ghost", PASSWD, GROUP) is None
    assert archives.resolve_owner("agent:ghosts", PASSWD, GROUP) is None
