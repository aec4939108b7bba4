"""Host-side path resolution inside a local sandbox's root (pure file-system logic; needs no bubblewrap): links are
followed inside the root and never out of it, and users come from the root's own passwd/group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harbor_gym.errors import SandboxError
from harbor_gym.sandbox.local._rootfs import open_in_root, read_in_root, resolve_user


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n"
    )
    (r / "etc" / "group").write_text("root:x:0:\nalice:x:1000:\nstaff:x:50:alice,bob\nwheel:x:10:\n")
    (r / "data").mkdir()
    (r / "data" / "file").write_text("inside")
    return r


def test_absolute_link_resolves_inside_the_root(root, tmp_path):
    (tmp_path / "secret").write_text("host secret")
    os.symlink(str(tmp_path / "secret"), root / "data" / "abs")  # absolute: means <root>/<that path>, missing
    os.symlink("/data/file", root / "data" / "abs2")
    assert read_in_root(str(root), "/data/abs", 100) is None
    assert read_in_root(str(root), "/data/abs2", 100) == b"inside"


def test_dotdot_never_climbs_above_the_root(root, tmp_path):
    (tmp_path / "file").write_text("host")
    os.symlink("../../../../file", root / "data" / "up")
    assert read_in_root(str(root), "/data/up", 100) is None
    assert read_in_root(str(root), "/../../data/file", 100) == b"inside"


def test_link_loops_are_refused(root):
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    with pytest.raises(OSError):
        open_in_root(str(root), "/loop1")


def test_read_is_capped_and_folders_are_not_files(root):
    assert read_in_root(str(root), "/data/file", 3) == b"ins"
    assert read_in_root(str(root), "/data", 3) is None


def test_users_come_from_the_roots_tables(root):
    alice = resolve_user(str(root), "alice")
    assert (alice.uid, alice.gid, alice.groups, alice.home) == (1000, 1000, (1000, 50), "/home/alice")
    assert resolve_user(str(root), "alice:wheel").gid == 10
    assert resolve_user(str(root), "0").name == "root"
    unknown = resolve_user(str(root), "4242")
    assert (unknown.uid, unknown.gid) == (4242, 0)  # as Docker: an unknown numeric uid gets gid 0
    with pytest.raises(SandboxError):
        resolve_user(str(root), "mallory")
