"""``load_dataset(path) -> Dataset``: a folder of task folders plus its ``dataset.toml`` settings.

Rules (written in SPEC style; DS-n are this module's, not SPEC IDs):

- **DS-1** A dataset is a folder; each direct subfolder holding a ``task.toml`` is a task whose ID is the
  subfolder name (FMT-3). Subfolders whose name starts with ``.`` or is ``__pycache__`` are never tasks.
- **DS-2** A subfolder without ``task.toml`` that looks like a task (it holds ``instruction.md``, ``tests/``,
  ``steps/`` or ``environment/``) is a failure (LOAD-1, ``task.toml`` missing); any other subfolder is ignored
  silently (shared files, docs).
- **DS-3** Settings come from ``<dataset>/dataset.toml`` (optional; absent = all defaults):
  ``timeout_multiplier`` (m of BUD-1/2, default 1.0, a finite number > 0 else LOAD-16 for the whole dataset),
  ``name``, ``description``. Unknown keys are ignored with one warning (FMT-14). Every loaded Task carries m.
- **DS-4** A task that fails to load lands in ``failures`` with its ``TaskLoadError``; the others still load.
- **DS-5** A folder that is itself a task (it holds ``task.toml``) is a dataset of one: that task, default
  settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from harbor_gym.config import EnvConfig
from harbor_gym.errors import TaskLoadError
from harbor_gym.task.loader import load_task
from harbor_gym.task.models import DatasetSettings
from harbor_gym.task.resolved import Task
from harbor_gym.task.toml_io import parse_settings_toml

__all__ = ["DATASET_SETTINGS_FILE", "Dataset", "load_dataset"]

DATASET_SETTINGS_FILE = "dataset.toml"
_TASK_HINTS = ("instruction.md", "tests", "steps", "environment")


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset: its folder, settings, the tasks that loaded and the ones that failed (by task ID)."""

    path: Path
    settings: DatasetSettings
    tasks: dict[str, Task] = field(default_factory=dict)
    failures: dict[str, TaskLoadError] = field(default_factory=dict)

    @property
    def task_ids(self) -> tuple[str, ...]:
        """IDs of the loaded tasks, sorted."""
        return tuple(sorted(self.tasks))


def load_dataset(path: str | os.PathLike[str], config: EnvConfig | None = None) -> Dataset:
    """Load every task folder of a dataset (DS-1..5 above).

    Args:
        path: the dataset folder (or a task folder, DS-5).
        config: passed to :func:`load_task` for each task.

    Returns:
        A Dataset; ``tasks`` and ``failures`` are keyed by task ID, in sorted order.

    Raises:
        TaskLoadError: the folder is missing (LOAD-1), or ``dataset.toml`` is invalid (LOAD-1; LOAD-16 for the
            multiplier). Per-task errors never raise; they go to ``failures``.
    """
    root = Path(os.path.abspath(os.fspath(path)))
    if not root.is_dir():
        raise TaskLoadError("dataset folder missing or not a folder", path=root, rule="LOAD-1")
    if (root / "task.toml").is_file():
        return Dataset(path=root, settings=DatasetSettings(), tasks={root.name: load_task(root, config)})
    settings_file = root / DATASET_SETTINGS_FILE
    settings = parse_settings_toml(settings_file) if settings_file.is_file() else DatasetSettings()
    tasks: dict[str, Task] = {}
    failures: dict[str, TaskLoadError] = {}
    for child in sorted(root.iterdir()):
        name = child.name
        if not child.is_dir() or name.startswith(".") or name == "__pycache__":
            continue
        if not (child / "task.toml").is_file():
            if any((child / hint).exists() for hint in _TASK_HINTS):
                failures[name] = TaskLoadError(
                    "looks like a task but has no task.toml", path=child / "task.toml", rule="LOAD-1"
                )
            continue
        try:
            tasks[name] = load_task(child, config, timeout_multiplier=settings.timeout_multiplier)
        except TaskLoadError as exc:
            failures[name] = exc
    return Dataset(path=root, settings=settings, tasks=tasks, failures=failures)
