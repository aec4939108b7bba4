"""`load_targets`: what ``harbor-gym run PATH`` runs — one task folder, or every task of a folder of task folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError, TaskLoadError

__all__ = ["Targets", "load_targets"]


@dataclass(frozen=True)
class Targets:
    """The tasks that loaded (by task id, sorted) and the dataset members that did not (DS-4)."""

    path: Path
    tasks: dict = field(default_factory=dict)
    failures: dict[str, TaskLoadError] = field(default_factory=dict)


def load_targets(path: str | Path, config: EnvConfig | None = None) -> Targets:
    """Load ``path``: a folder holding ``task.toml`` is one task; any other folder is a dataset of task folders.

    Raises:
        ConfigError: ``path`` does not exist, is not a folder, or holds no task folder (bad input: exit 2).
        TaskLoadError: ``path`` is a task folder that is refused (LOAD-*), or the dataset's own settings are
            refused (LOAD-16): nothing can run (exit 2). A member task that fails to load does not raise: it lands
            in ``failures`` and the others still run.
    """
    from harbor_gym.task import load_dataset, load_task

    root = Path(path)
    if not root.exists():
        raise ConfigError("no such file or folder", path=root, field="PATH")
    if not root.is_dir():
        raise ConfigError("not a task folder or a folder of task folders", path=root, field="PATH")
    if (root / "task.toml").is_file():
        task = load_task(root, config)
        return Targets(root, {task.id: task}, {})
    dataset = load_dataset(root, config)
    if not dataset.tasks and not dataset.failures:
        raise ConfigError("holds no task folder (no task.toml in it or its subfolders)", path=root, field="PATH")
    return Targets(root, dict(sorted(dataset.tasks.items())), dict(sorted(dataset.failures.items())))
