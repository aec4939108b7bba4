"""Builders of tiny task folders in ``tmp_path`` for the task-layer tests, and a refusal checker."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from harbor_gym.errors import TaskLoadError

IMAGE = '[environment]\ndocker_image = "debian:bookworm-slim"\n'
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
SOLVE_SH = "#!/bin/bash\ntrue\n"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tasks"


def write_tree(root: Path, files: dict[str, str | None]) -> Path:
    """Write ``files`` (relative path -> text; ``None`` = an empty folder) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    return root


def steps_toml(names: Iterable[str]) -> str:
    return "".join(f'[[steps]]\nname = "{name}"\n' for name in names)


class Builder:
    """Builds task folders under one base folder; each call makes a new folder."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def _root(self, name: str | None) -> Path:
        self.count += 1
        return self.base / (name or f"task{self.count}")

    def single(
        self,
        toml: str = IMAGE,
        files: dict[str, str | None] | None = None,
        drop: Iterable[str] = (),
        name=None,
    ) -> Path:
        """A valid single-step task: task.toml, instruction.md, tests/test.sh (``drop`` removes some)."""
        tree: dict[str, str | None] = {
            "task.toml": toml,
            "instruction.md": "Do it.\n",
            "tests/test.sh": TEST_SH,
        }
        tree.update(files or {})
        for rel in drop:
            tree.pop(rel)
        return write_tree(self._root(name), tree)

    def multi(
        self,
        toml: str | None = None,
        steps: Iterable[str] = ("one", "two"),
        files: dict[str, str | None] | None = None,
        drop: Iterable[str] = (),
        own_tests: bool = True,
        name=None,
    ) -> Path:
        """A valid multi-step task; each step has instruction.md and (``own_tests``) tests/test.sh."""
        steps = list(steps)
        tree: dict[str, str | None] = {"task.toml": toml if toml is not None else IMAGE + steps_toml(steps)}
        for step in steps:
            tree[f"steps/{step}/instruction.md"] = f"Do {step}.\n"
            if own_tests:
                tree[f"steps/{step}/tests/test.sh"] = TEST_SH
        if not own_tests:
            tree["tests/test.sh"] = TEST_SH
        tree.update(files or {})
        for rel in drop:
            tree.pop(rel)
        return write_tree(self._root(name), tree)


@pytest.fixture
def build(tmp_path: Path) -> Builder:
    return Builder(tmp_path)


def assert_refused(
    excinfo: pytest.ExceptionInfo[TaskLoadError], rule: str, field: str | None, folder: Path
) -> None:
    """The error names the rule, the field/step (substring) and the task folder, as LOAD-1..16 require."""
    err = excinfo.value
    text = str(err)
    assert err.rule == rule, text
    assert f"[{rule}]" in text, text
    assert str(folder) in text, text
    if field is not None:
        assert field in text, text
