"""FMT-16 .harborignore and the upload listing."""

from __future__ import annotations

from harbor_gym.task import upload_listing

from .conftest import write_tree


def test_fmt_16_harborignore_gitignore_syntax(tmp_path):
    # SPEC: FMT-16
    folder = write_tree(
        tmp_path / "tests",
        {
            ".harborignore": "# comment\n*.pyc\nbuild/\n!keep.pyc\n/top.txt\n",
            "test.sh": "x",
            "a.pyc": "x",
            "keep.pyc": "x",
            "top.txt": "x",
            "sub/top.txt": "x",
            "sub/b.pyc": "x",
            "build/out.bin": "x",
            "sub/build/x": "x",
            "empty": None,
        },
    )
    listing = upload_listing(folder)
    assert [rel for _, rel in listing] == ["keep.pyc", "sub/top.txt", "test.sh"]
    assert all(local == folder / rel for local, rel in listing)


def test_fmt_16_without_ignore_file_everything_is_listed(tmp_path):
    # SPEC: FMT-16 — the .harborignore itself is never uploaded, unless ignoring is off
    folder = write_tree(tmp_path / "w", {".harborignore": "*\n", "a": "x", "d/b": "y"})
    assert [rel for _, rel in upload_listing(folder)] == []
    assert [rel for _, rel in upload_listing(folder, honour_ignore=False)] == [".harborignore", "a", "d/b"]


def test_symlinks_inside_are_followed(tmp_path):
    # SPEC: LOAD-13 — links inside the boundary are fine
    root = write_tree(tmp_path / "task", {"shared/lib.sh": "x", "tests/test.sh": "x"})
    (root / "tests" / "lib").symlink_to(root / "shared")
    rels = [rel for _, rel in upload_listing(root / "tests", root=root)]
    assert rels == ["lib/lib.sh", "test.sh"]
