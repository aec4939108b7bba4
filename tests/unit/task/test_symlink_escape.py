"""LOAD-13 / GYM-10: every path of a task folder that is uploaded or read resolves inside the folder.

Property-style: every place a link can sit (the input folders themselves, a file or folder inside them, the files
the loader reads) crossed with every way a link can leave (absolute, relative with ``..``, a chain of links whose
last hop leaves, a link to a link to a folder outside); each is refused naming the path and LOAD-13. The same
places with links that stay inside load.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harbor_gym.errors import TaskLoadError
from harbor_gym.task import load_task, upload_listing
from harbor_gym.task.files import check_inside

from .conftest import IMAGE, SOLVE_SH, TEST_SH, steps_toml, write_tree

SECRET = "host-secret-contents\n"


def _outside(tmp_path: Path) -> Path:
    """A host folder outside every task folder, shaped so that it would pass as any input folder."""
    out = tmp_path / "host"
    write_tree(out, {"test.sh": TEST_SH, "solve.sh": SOLVE_SH, "instruction.md": "x\n", "tests/test.sh": TEST_SH,
                     "secret.txt": SECRET, "Dockerfile": "FROM debian\n", "two/instruction.md": "x\n",
                     "two/tests/test.sh": TEST_SH})
    return out


def _task(tmp_path: Path, name: str = "task") -> Path:
    """A valid two-step task with every input folder: environment/, tests/, solution/, steps/<name>/."""
    return write_tree(tmp_path / name, {
        "task.toml": IMAGE + steps_toml(["one", "two"]),
        "instruction.md": "Do it.\n",
        "environment/app/main.py": "print(1)\n",
        "tests/test.sh": TEST_SH,
        "solution/solve.sh": SOLVE_SH,
        "steps/one/instruction.md": "one\n",
        "steps/one/tests/test.sh": TEST_SH,
        "steps/one/workdir/data.txt": "d\n",
        "steps/two/instruction.md": "two\n",
        "steps/two/tests/test.sh": TEST_SH,
    })


def _replace_with_link(path: Path, target: str) -> None:
    """Make ``path`` a symlink to ``target`` (whatever was there goes)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        import shutil

        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


# (where the link sits, relative to the task folder; what it stands for outside: a folder or a file)
PLACES = [
    ("environment", "dir"),
    ("tests", "dir"),
    ("solution", "dir"),
    ("steps", "dir"),
    ("steps/two", "dir"),
    ("steps/one/tests", "dir"),
    ("steps/one/workdir", "dir"),
    ("environment/app", "dir"),
    ("environment/app/main.py", "file"),
    ("environment/extra.txt", "file"),
    ("tests/data.txt", "file"),
    ("tests/sub/deep/data.txt", "file"),
    ("solution/lib", "dir"),
    ("steps/one/workdir/data.txt", "file"),
    ("steps/two/instruction.md", "file"),
    ("instruction.md", "file"),
]


def _escape_target(kind: str, style: str, link: Path, outside: Path, root: Path) -> str:
    """A link target that leaves the task folder, in one of several spellings."""
    target = outside if kind == "dir" else outside / "secret.txt"
    if kind == "dir" and link.name == "steps":
        target = outside  # holds two/instruction.md, two/tests/test.sh
    if kind == "dir" and link.name in ("tests", "solution", "two", "environment"):
        target = outside
    if style == "absolute":
        return str(target)
    if style == "relative":
        return os.path.relpath(target, link.parent)
    # "chain": a link inside the task folder whose own target leaves it
    hop = root / f".hop-{link.name}"
    hop.symlink_to(target)
    return os.path.relpath(hop, link.parent)


@pytest.mark.parametrize("style", ["absolute", "relative", "chain"])
@pytest.mark.parametrize("place,kind", PLACES, ids=[p for p, _ in PLACES])
def test_load_13_link_leaving_the_task_folder_is_refused(tmp_path, place, kind, style):
    # SPEC: GYM-10, LOAD-13 — wherever a link sits and however it is spelt, leaving the folder is refused
    outside = _outside(tmp_path)
    root = _task(tmp_path)
    link = root / place
    _replace_with_link(link, _escape_target(kind, style, link, outside, root))
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    err = excinfo.value
    assert err.rule == "LOAD-13", str(err)
    assert "[LOAD-13]" in str(err)
    assert str(root) in str(err)
    assert place.split("/")[-1] in str(err), str(err)  # the offending path is named


@pytest.mark.parametrize("place,kind", PLACES, ids=[p for p, _ in PLACES])
def test_load_13_link_staying_inside_loads(tmp_path, place, kind):
    # SPEC: GYM-10, LOAD-13 — links that stay inside the task folder are fine
    root = _task(tmp_path)
    link = root / place
    shadow = root / "shadow" / place  # a copy of what was there, elsewhere inside the folder
    original = link
    if original.is_dir():
        import shutil

        shutil.copytree(original, shadow)
    elif original.is_file():
        shadow.parent.mkdir(parents=True, exist_ok=True)
        shadow.write_bytes(original.read_bytes())
    elif kind == "dir":
        shadow.mkdir(parents=True)
        (shadow / "x.txt").write_text("x")
    else:
        shadow.parent.mkdir(parents=True, exist_ok=True)
        shadow.write_text("inside\n")
    _replace_with_link(link, os.path.relpath(shadow, link.parent))
    task = load_task(root)
    assert task.id == "task"


def test_load_13_environment_link_out_is_not_uploaded_by_the_listing(tmp_path):
    # SPEC: GYM-10 — the upload path itself refuses a linked input folder, whoever calls it
    outside = _outside(tmp_path)
    root = _task(tmp_path)
    _replace_with_link(root / "environment", str(outside))
    with pytest.raises(TaskLoadError) as excinfo:
        upload_listing(root / "environment", root=root, honour_ignore=False)
    assert excinfo.value.rule == "LOAD-13"
    assert "environment" in str(excinfo.value)


def test_load_13_environment_link_with_docker_image_refused(tmp_path):
    # SPEC: GYM-10, LOAD-13 — the case: docker_image task whose environment/ is a host folder
    outside = _outside(tmp_path)
    root = write_tree(tmp_path / "t", {"task.toml": IMAGE, "instruction.md": "x\n", "tests/test.sh": TEST_SH})
    (root / "environment").symlink_to(outside)
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    assert excinfo.value.rule == "LOAD-13"
    assert str(outside) in str(excinfo.value)


def test_load_13_compose_environment_link_out_refused(tmp_path):
    # SPEC: GYM-10, LOAD-13 — a compose environment reached through a link out (its binds would be host paths)
    outside = write_tree(tmp_path / "hostenv", {
        "docker-compose.yaml": "services:\n  main:\n    image: debian\n    volumes:\n      - ./data:/data\n",
        "data/x": "x"})
    root = write_tree(tmp_path / "t", {"task.toml": "", "instruction.md": "x\n", "tests/test.sh": TEST_SH})
    (root / "environment").symlink_to(outside)
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    assert excinfo.value.rule == "LOAD-13"


def test_load_13_dangling_and_cyclic_input_links(tmp_path):
    # SPEC: LOAD-13 — an input link that leads nowhere is refused, not skipped
    root = _task(tmp_path)
    _replace_with_link(root / "environment", str(tmp_path / "missing"))
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    assert excinfo.value.rule == "LOAD-13"
    root2 = _task(tmp_path, "task2")
    _replace_with_link(root2 / "solution", "solution")  # a link to itself
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root2)
    assert excinfo.value.rule == "LOAD-13"


def test_check_inside_accepts_inside_and_missing(tmp_path):
    # SPEC: LOAD-13
    root = write_tree(tmp_path / "r", {"a/b.txt": "x"})
    (root / "link").symlink_to("a")
    check_inside(root / "link", root)
    check_inside(root / "nothing", root)
    (root / "out").symlink_to("..")
    with pytest.raises(TaskLoadError):
        check_inside(root / "out", root)
