"""load_dataset: a folder of task folders, dataset.toml settings (LOAD-16), failures kept apart."""

from __future__ import annotations

import warnings

import pytest

from harbor_gym.errors import TaskLoadError
from harbor_gym.task import UnknownKeyWarning, load_dataset

from .conftest import Builder, write_tree


def test_dataset_with_one_broken_task(tmp_path):
    # brief: a task that fails to load goes to failures, the others still load
    build = Builder(tmp_path / "ds")
    build.single(name="good")
    build.multi(name="also-good")
    build.single(name="broken", drop=["tests/test.sh"])
    write_tree(
        tmp_path / "ds",
        {
            "docs/README.md": "x",
            ".hidden/task.toml": "x",
            "__pycache__/x.pyc": "x",
            "halfway/instruction.md": "x",
            "notes.txt": "x",
        },
    )
    ds = load_dataset(tmp_path / "ds")
    assert ds.task_ids == ("also-good", "good")
    assert set(ds.failures) == {"broken", "halfway"}
    assert ds.failures["broken"].rule == "LOAD-5" and "broken" in str(ds.failures["broken"])
    assert ds.failures["halfway"].rule == "LOAD-1"
    assert ds.settings.timeout_multiplier == 1.0
    assert all(task.timeout_multiplier == 1.0 for task in ds.tasks.values())
    assert ds.tasks["good"].id == "good"


def test_dataset_multiplier_reaches_every_task(tmp_path):
    # SPEC: BUD-1/2 (m), DS-3
    build = Builder(tmp_path / "ds")
    build.single(name="a")
    build.multi(name="b")
    (tmp_path / "ds" / "dataset.toml").write_text('name = "mine"\ntimeout_multiplier = 2\n')
    ds = load_dataset(tmp_path / "ds")
    assert ds.settings.timeout_multiplier == 2.0 and ds.settings.name == "mine"
    assert [t.timeout_multiplier for t in ds.tasks.values()] == [2.0, 2.0]


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", '"2"', "true"])
def test_load_16_dataset_multiplier(tmp_path, value):
    # SPEC: LOAD-16
    Builder(tmp_path / "ds").single(name="a")
    (tmp_path / "ds" / "dataset.toml").write_text(f"timeout_multiplier = {value}\n")
    with pytest.raises(TaskLoadError) as excinfo:
        load_dataset(tmp_path / "ds")
    assert excinfo.value.rule == "LOAD-16"
    assert "timeout_multiplier" in str(excinfo.value) and str(tmp_path / "ds") in str(excinfo.value)


def test_dataset_settings_unknown_key_warns(tmp_path):
    # SPEC: FMT-14 for dataset.toml
    Builder(tmp_path / "ds").single(name="a")
    (tmp_path / "ds" / "dataset.toml").write_text("timeout_multiplier = 1.5\nspeed = 3\n")
    with pytest.warns(UnknownKeyWarning, match="speed"):
        assert load_dataset(tmp_path / "ds").settings.timeout_multiplier == 1.5


def test_dataset_of_one(tmp_path):
    # DS-5: a task folder is a dataset of one
    root = Builder(tmp_path).single(name="solo")
    ds = load_dataset(root)
    assert ds.task_ids == ("solo",) and not ds.failures


def test_dataset_folder_missing(tmp_path):
    with pytest.raises(TaskLoadError, match="LOAD-1"):
        load_dataset(tmp_path / "none")


def test_dataset_loads_fixtures():
    from .conftest import FIXTURES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = load_dataset(FIXTURES)
    assert not ds.failures and set(ds.tasks) >= {"single-minimal", "multi-full", "legacy"}
