"""The trusted channel's copy logic without a sandbox (SPEC GYM-10): tar streams as the engine sends them, and
host-side O_NOFOLLOW walks of a folder, under a `CopyBudget`."""

from __future__ import annotations

import io
import os
import tarfile

from harbor_gym.sandbox.channel import CopyBudget, copy_from_root, copy_tar_stream, safe_relname

MiB = 1 << 20


def _tar(members: list[tuple[str, str, bytes | str]]) -> list[bytes]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    data = buf.getvalue()
    return [data[i:i + 4096] for i in range(0, len(data), 4096)]


# SPEC: GYM-10 (names confined: absolute, climbing and NUL names are refused)
def test_gym_10_safe_relname():
    assert safe_relname("a/./b") == "a/b" and safe_relname("") == ""
    assert safe_relname("/etc/x") is None and safe_relname("a/../../x") is None and safe_relname("a\0b") is None


# SPEC: GYM-10 (an engine stream: escaping names refused, links recorded not created, devices and fifos refused, a
# file over its cap cut, reserved files read to cap + 1 outside the budget)
def test_gym_10_tar_stream_confines_records_and_caps(tmp_path):
    chunks = _tar([("verifier", "dir", b""), ("verifier/ok.txt", "reg", b"hello"),
                   ("verifier/../../../etc/evil", "reg", b"x"), ("/abs", "reg", b"x"),
                   ("verifier/big", "reg", b"z" * (3 * MiB)), ("verifier/shadow", "sym", "/etc/shadow"),
                   ("verifier/ff", "fifo", b""), ("verifier/null", "chr", b""),
                   ("verifier/reward.json", "reg", b"9" * 200)])
    budget = CopyBudget(file_cap=MiB, turn_cap=10 * MiB)
    rep = copy_tar_stream(chunks, tmp_path / "out", budget, reserved={"reward.json": 100})
    assert rep.kind == "directory"
    assert (tmp_path / "out" / "ok.txt").read_bytes() == b"hello"
    assert (tmp_path / "out" / "big").stat().st_size == MiB and rep.files["big"].truncated and rep.truncated
    assert rep.links == {"shadow": "/etc/shadow"} and not os.path.lexists(tmp_path / "out" / "shadow")
    assert rep.refused["ff"] == "fifo" and rep.refused["null"] == "device"
    assert sum(1 for why in rep.refused.values() if why == "bad name") == 2
    assert not (tmp_path / "etc").exists() and not os.path.exists("/abs")
    assert rep.files["reward.json"].truncated and len(rep.data["reward.json"]) == 101
    assert not (tmp_path / "out" / "reward.json").exists()  # an over-cap reward file is never kept
    assert budget.used <= MiB + 5 + 9 * 512


# SPEC: GYM-10 (the turn budget spans copies; past it, files are cut and the copy says so)
def test_gym_10_turn_budget_spans_copies(tmp_path):
    budget = CopyBudget(file_cap=MiB, turn_cap=MiB + 4096)
    one = copy_tar_stream(_tar([("a", "dir", b""), ("a/x", "reg", b"1" * (MiB - 10))]), tmp_path / "a", budget)
    two = copy_tar_stream(_tar([("b", "dir", b""), ("b/y", "reg", b"2" * MiB)]), tmp_path / "b", budget)
    assert not one.truncated and two.truncated
    assert budget.used <= budget.turn_cap


# SPEC: GYM-10 (host-side walk: a sparse file costs what is read, links are recorded, a fifo never blocks, a link
# swapped in for the source is not followed)
def test_gym_10_host_walk_nofollow(tmp_path):
    src = tmp_path / "root" / "logs"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("data")
    with open(src / "sparse", "wb") as fh:
        fh.truncate(1 << 30)
    os.symlink("/etc", src / "etc")
    os.mkfifo(src / "fifo")
    os.symlink("/etc", tmp_path / "root" / "linked")
    budget = CopyBudget(file_cap=MiB, turn_cap=10 * MiB)
    root = os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY)
    try:
        rep = copy_from_root(root, root, "logs", tmp_path / "out", budget)
        linked = copy_from_root(root, root, "linked", tmp_path / "out2", budget)
    finally:
        os.close(root)
    assert rep.kind == "directory" and rep.files["sparse"] == rep.files["sparse"].__class__(MiB, True)
    assert (tmp_path / "out" / "sub" / "f.txt").read_text() == "data"
    assert rep.links == {"etc": "/etc"} and rep.refused == {"fifo": "fifo"}
    assert linked.kind == "link" and linked.links == {"": "/etc"} and not (tmp_path / "out2").exists()
