"""P2 "a run always ends" for untrusted input: random and mutated task folders either load or raise TaskLoadError
(never another exception, never a hang), and archives coming back from a sandbox that would escape their
destination are refused before anything is written (the escaping-symlink case end to end on Docker)."""

from __future__ import annotations

import io
import os
import shutil
import signal
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harbor_gym.errors import ArchiveError, TaskLoadError
from harbor_gym.sandbox.archives import safe_extract
from harbor_gym.task import load_task

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "tasks"
LOAD_BOUND_S = 10


@contextmanager
def _bounded(seconds: int):
    """Fail (instead of hanging) if the block runs longer than ``seconds``."""
    def alarm(*_):
        raise TimeoutError(f"load_task did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _load_or_refuse(folder: Path) -> None:
    with _bounded(LOAD_BOUND_S):
        try:
            load_task(folder)
        except TaskLoadError:
            pass


NAMES = st.sampled_from(["task.toml", "instruction.md", "tests", "tests/test.sh", "environment",
                         "environment/Dockerfile", "environment/docker-compose.yaml", "solution/solve.sh",
                         "steps", "steps/a", "steps/a/instruction.md", "steps/a/tests/test.sh",
                         "steps/a/workdir/setup.sh", "steps/b/instruction.md", "tests/.harborignore",
                         "steps/a/tests/.harborignore"])
CONTENT = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                    st.sampled_from([b"", b"\xff\xfe", b"[[steps]]\nname = 'a'\n", b'[environment]\ndocker_image = "x"\n',
                                     b"test.sh\n", b"*\n", b"services:\n  main:\n    image: x\n"]))
KIND = st.sampled_from(["file", "dir", "link-in", "link-out", "link-loop", "fifo"])


def _make(root: Path, name: str, kind: str, data: bytes) -> None:
    path = root / name
    # Never build through a link an earlier entry made (``steps`` -> /etc, then ``steps/a/tests/.harborignore``
    # would write /etc/a/tests/.harborignore on the host): the fuzz itself must stay inside its folder.
    parts = Path(name).parts
    if any((root / Path(*parts[:i])).is_symlink() for i in range(1, len(parts))):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            return
        if kind == "file":
            path.write_bytes(data)
        elif kind == "dir":
            path.mkdir()
        elif kind == "link-in":
            path.symlink_to(root / "tests")
        elif kind == "link-out":
            path.symlink_to("/etc")
        elif kind == "link-loop":
            path.symlink_to(path)
        elif kind == "fifo":
            os.mkfifo(path)  # reading it would block forever: the loader must not
    except (OSError, ValueError):
        pass  # a layout the file system refuses is simply not made


# SPEC: LOAD-1, LOAD-3, LOAD-5, LOAD-13, LOAD-14 (P2: a random folder layout loads or is refused, in bounded time)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(st.lists(st.tuples(NAMES, KIND, CONTENT), max_size=10), st.sampled_from(["multi-full", "legacy",
                                                                               "single-minimal", None]))
def test_p2_random_folder_layouts_load_or_raise_task_load_error(entries, base):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        if base is None:
            root.mkdir()
        else:
            shutil.copytree(FIXTURES / base, root, symlinks=True)
        for name, kind, data in entries:
            if base is not None and (root / name).exists() and kind == "file":
                (root / name).unlink() if (root / name).is_file() else None
            _make(root, name, kind, data)
        _load_or_refuse(root)


# SPEC: LOAD-1 (P2: byte-level mutations of real task.toml files load or are refused, in bounded time)
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["multi-full", "legacy", "single-minimal"]), st.data())
def test_p2_mutated_task_toml_bytes_load_or_raise_task_load_error(base, data):
    raw = bytearray((FIXTURES / base / "task.toml").read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        pos = data.draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[pos:pos] = data.draw(st.sampled_from([b"[", b"]", b"=", b'"', b"\n", b"[[steps]]\n", b"\x00",
                                                       b"nan", b"1e999", b"'''", b"\\u0000"]))
        elif op == "delete" and raw:
            del raw[pos:pos + data.draw(st.integers(1, 20))]
        elif op == "dup" and raw:
            raw[pos:pos] = raw[pos:pos + data.draw(st.integers(1, 60))]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        shutil.copytree(FIXTURES / base, root)
        (root / "task.toml").write_bytes(bytes(raw))
        _load_or_refuse(root)


def _tar(members: list[tuple[str, str, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, target
                tar.addfile(info)
    return buf.getvalue()


ESCAPES = st.sampled_from([
    [("/etc/evil", "file", "")],
    [("../evil", "file", "")],
    [("a/../../evil", "file", "")],
    [("a", "sym", "/etc"), ("a/evil", "file", "")],
    [("a", "sym", "../.."), ("a/evil", "file", "")],
    [("out", "sym", "/etc/passwd")],
    [("out", "sym", "../../../etc")],
    [("d", "dir", ""), ("d/l", "sym", "../../x")],
    [("h", "hard", "/etc/passwd")],
    [("l1", "sym", "l2"), ("l2", "sym", "..")],
])
SAFE_PREFIX = st.lists(st.tuples(st.sampled_from(["ok", "ok/a", "ok2"]), st.sampled_from(["file", "dir"]),
                                 st.just("")), max_size=3, unique_by=lambda m: m[0])


# SPEC: ART-4, VER-5 (P1/P3: an archive with absolute names, '..' or escaping links is refused, nothing written)
@settings(max_examples=80, deadline=None)
@given(SAFE_PREFIX, ESCAPES, st.booleans())
def test_p2_escaping_archives_are_refused_and_write_nothing(prefix, escape, escape_first):
    members = (escape + prefix) if escape_first else (prefix + escape)
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "dest"
        dest.mkdir()
        outside_before = sorted(p.name for p in Path(tmp).iterdir())
        with pytest.raises(ArchiveError):
            safe_extract(io.BytesIO(_tar(members)), dest)
        assert list(dest.iterdir()) == []  # nothing of the archive was written
        assert sorted(p.name for p in Path(tmp).iterdir()) == outside_before


# SPEC: ART-3, ART-4 (P1/P3 end to end: escaping symlinks an agent leaves in /logs/artifacts never land on the host)
@pytest.mark.docker
def test_p2_escaping_symlinks_from_a_real_sandbox_are_refused(tmp_path):
    from .helpers import config, grade, run_episode, toml, write_task

    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": grade("true")}, name="arts")
    logs = tmp_path / "logs"
    attack = ("mkdir -p /logs/artifacts/d && echo ok > /logs/artifacts/d/fine.txt && "
              "ln -s /etc/passwd /logs/artifacts/abs && ln -s ../../../../../../etc /logs/artifacts/d/up")
    results, final = run_episode(task, attack, config(logs_root=str(logs)))
    record = results[0].record
    assert record.reward == 1.0 and final.reward == 1.0  # a refused copy never fails the turn (ART-3)
    assert [m.status for m in record.manifest] in (["failed"], ["ok"])
    for path in logs.rglob("*"):
        if path.is_symlink():
            target = os.path.realpath(path)
            assert target.startswith(str(logs)), f"{path} -> {target} escapes the log folder"
