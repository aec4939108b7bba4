"""DIFF-8: under ``semantics="harbor"`` the loader accepts every step name Harbor accepts (a portable folder name of
at most 255 UTF-8 bytes); Seed semantics keep FMT-12."""

from __future__ import annotations

import pytest

from harbor_gym.errors import TaskLoadError
from harbor_gym.task import load_task

from .conftest import IMAGE, assert_refused, steps_toml

HARBOR, SEED = {"semantics": "harbor"}, {"semantics": "seed"}


@pytest.mark.parametrize("name", ["a b", "-lead", ".hidden", "é-step", "Step (1): build", "x" * 253 + " y"])
def test_diff_8_harbor_accepts_what_seed_refuses(build, name):
    # SPEC: DIFF-8, LOAD-2, FMT-12
    root = build.multi(steps=[name, "two"])
    task = load_task(root, HARBOR)
    assert [s.name for s in task.steps] == [name, "two"]
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root, SEED)
    assert_refused(excinfo, "LOAD-2", "steps[0].name", root)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "é" * 128])
def test_diff_8_harbor_refuses_non_portable_names(build, name):
    # SPEC: DIFF-8, LOAD-2 (no '/', not '.'/'..', at most 255 UTF-8 bytes: "é" * 128 is 256)
    root = build.multi(toml=IMAGE + steps_toml([name]), steps=[])
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root, HARBOR)
    assert_refused(excinfo, "LOAD-2", "steps[0].name", root)
