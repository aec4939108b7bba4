"""`load_targets`: what ``harbor-gym run PATH`` runs — one task folder, every task of a folder of task folders, or
a dataset by name (``NAME@VERSION``) from the registry."""

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
    """Load ``path``: a folder holding ``task.toml`` is one task; any other folder is a dataset of task folders;
    a ``NAME@VERSION`` that is not an existing path is a dataset of the registry in force (`harbor_gym.datasets`),
    fetched once into the cache.

    Raises:
        ConfigError: ``path`` does not exist, is not a folder, or holds no task folder (bad input: exit 2).
        DatasetError: a ``NAME@VERSION`` with no registry configured, unknown to it, or that cannot be fetched
            (a wrong commit, a missing task path).
        TaskLoadError: ``path`` is a task folder that is refused (LOAD-*), or the dataset's own settings are
            refused (LOAD-16): nothing can run (exit 2). A member task that fails to load does not raise: it lands
            in ``failures`` and the others still run.
    """
    from harbor_gym.datasets import resolve_dataset
    from harbor_gym.task import load_dataset, load_task

    root = Path(path)
    if not root.exists():
        folder = resolve_dataset(str(path), config)  # NAME@VERSION through the registry; a path always wins
        if folder is None:
            raise ConfigError("no such file or folder (nor a dataset name NAME@VERSION)", path=root, field="PATH")
        dataset = load_dataset(folder, config)
        return Targets(folder, dict(sorted(dataset.tasks.items())), dict(sorted(dataset.failures.items())))
    if not root.is_dir():
        raise ConfigError("not a task folder or a folder of task folders", path=root, field="PATH")
    if (root / "task.toml").is_file():
        task = load_task(root, config)
        return Targets(root, {task.id: task}, {})
    dataset = load_dataset(root, config)
    if not dataset.tasks and not dataset.failures:
        raise ConfigError("holds no task folder (no task.toml in it or its subfolders)", path=root, field="PATH")
    return Targets(root, dict(sorted(dataset.tasks.items())), dict(sorted(dataset.failures.items())))
