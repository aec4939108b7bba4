"""Which files of a task input folder get uploaded: ``.harborignore`` (FMT-16) and the LOAD-13 path checks.

Rules followed by :func:`upload_listing`:

- the folder is walked recursively in sorted order; symlinked folders are followed, symlinks are listed by
  their own path (reading them reads the target);
- the folder itself must resolve inside ``root`` (the task folder): an ``environment/``, ``tests/`` or
  ``steps/<name>/`` that is itself a symlink leaving the task folder is LOAD-13 (SPEC GYM-10), checked again here
  at upload time so that no caller can upload a host folder by passing a linked folder;
- a symlink whose target does not exist, or resolves outside ``root`` (the task folder), is LOAD-13; so is a
  folder reached again through its own descendants (a symlink cycle);
- with ``honour_ignore`` and a ``.harborignore`` at the folder's top, its lines are gitignore patterns
  (``pathspec``'s ``GitIgnoreSpec``) matched against paths relative to the folder; a matching file is left
  out, a matching folder is left out with everything in it; the ``.harborignore`` file itself is never
  uploaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import pathspec

from harbor_gym.errors import TaskLoadError

__all__ = ["HARBORIGNORE", "is_within", "check_inside", "upload_listing"]

HARBORIGNORE = ".harborignore"


def is_within(path: Path, root: Path) -> bool:
    """True iff the resolved ``path`` is ``root`` (resolved) or lies under it."""
    resolved, base = path.resolve(), root.resolve()
    return resolved == base or base in resolved.parents


def check_inside(path: Path, root: Path, *, field: str | None = None) -> None:
    """LOAD-13 (SPEC GYM-10): ``path`` (a file or folder of the task, possibly itself a symlink, possibly a link
    to a link) must resolve inside ``root``; a missing path passes, a dangling or cyclic link does not.

    Raises:
        TaskLoadError: LOAD-13 naming ``path``, where it leads and ``field``.
    """
    path = Path(path)
    if not path.is_symlink() and not path.exists():
        return
    try:
        target = path.resolve(strict=True)
    except (RuntimeError, OSError) as exc:  # a dangling link or a link loop (RuntimeError on Python 3.11)
        raise TaskLoadError(f"symlink is dangling or a cycle: {exc}", path=path, field=field,
                            rule="LOAD-13") from exc
    if not is_within(target, root):
        raise TaskLoadError(f"resolves outside the task folder ({target}); a task may only link inside itself",
                            path=path, field=field, rule="LOAD-13")


def _spec(folder: Path) -> pathspec.PathSpec | None:
    ignore = folder / HARBORIGNORE
    if not ignore.is_file():
        return None
    lines = ignore.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def upload_listing(
    folder: Path, *, root: Path | None = None, honour_ignore: bool = True
) -> list[tuple[Path, str]]:
    """List the files of ``folder`` to upload, as (local path, relative POSIX path), sorted by relative path.

    Args:
        folder: the input folder (``tests/``, ``solution/``, ``steps/<name>/tests/``, a ``workdir/``...).
        root: the boundary no file may resolve outside of (LOAD-13); default: ``folder`` itself.
        honour_ignore: apply ``folder/.harborignore`` (FMT-16); off for folders FMT-16 does not name.

    Returns:
        Every regular file (or symlink to one) not excluded, never the ``.harborignore`` itself.

    Raises:
        TaskLoadError: LOAD-13 for ``folder`` itself resolving outside ``root``, a dangling symlink, a symlink
            resolving outside ``root``, or a symlink cycle; the error's path is the offending entry.
    """
    folder = Path(folder)
    boundary = (root if root is not None else folder).resolve()
    if root is not None:
        check_inside(folder, boundary)
    spec = _spec(folder) if honour_ignore else None
    out: list[tuple[Path, str]] = []

    def walk(current: Path, rel: str, ancestors: frozenset[Path]) -> None:
        try:
            names = sorted(os.listdir(current))
        except OSError as exc:
            raise TaskLoadError(f"cannot list folder: {exc}", path=current, rule="LOAD-13") from exc
        for name in names:
            entry = current / name
            rel_path = f"{rel}{name}"
            if entry.is_symlink():
                try:
                    target = entry.resolve()
                except (RuntimeError, OSError) as exc:  # Python 3.11 raises RuntimeError on a link loop
                    raise TaskLoadError("symlink cycle", path=entry, rule="LOAD-13") from exc
                if not target.exists():
                    raise TaskLoadError("symlink target does not exist", path=entry, rule="LOAD-13")
                if not (target == boundary or boundary in target.parents):
                    raise TaskLoadError(
                        f"symlink resolves outside the task folder ({target})", path=entry, rule="LOAD-13"
                    )
            if entry.is_dir():
                if spec is not None and spec.match_file(rel_path + "/"):
                    continue
                real = entry.resolve()
                if real in ancestors:
                    raise TaskLoadError("symlink cycle", path=entry, rule="LOAD-13")
                walk(entry, rel_path + "/", ancestors | {real})
                continue
            if not rel and name == HARBORIGNORE and honour_ignore:
                continue
            if spec is not None and spec.match_file(rel_path):
                continue
            out.append((entry, rel_path))

    walk(folder, "", frozenset({folder.resolve()}))
    return out
