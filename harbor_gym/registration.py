"""Gymnasium registration: generic ids for any task or dataset folder, one id per shipped example, and `make`.

Ids (all ``nondeterministic=True``: a sandbox is a real system, SPEC GYM-1; all with the vector entry point
`harbor_gym.vector.HarborVectorEnv`, so ``gymnasium.make_vec(id, num_envs=N)`` builds it):
- ``harbor_gym/HarborTask-v0`` (kwarg ``path``: a task folder),
- ``harbor_gym/HarborDataset-v0`` (kwarg ``path``: a folder of task folders),
- ``harbor_gym/<example>-v0`` for each folder of ``envs/`` shipped with the package.

`make` also takes a folder path or a dataset name ``NAME@VERSION`` (through the registry in force), and names what it
could not find instead of raising Gymnasium's namespace error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym

__all__ = ["register_envs", "make", "TASK_ID", "DATASET_ID", "example_id", "VECTOR_ENTRY_POINT"]

TASK_ID = "harbor_gym/HarborTask-v0"
DATASET_ID = "harbor_gym/HarborDataset-v0"


def example_id(name: str) -> str:
    """The Gymnasium id of the shipped example ``name``."""
    return f"harbor_gym/{name}-v0"


#: The vector entry point of every id (``gymnasium.make_vec(id, vectorization_mode="vector_entry_point")``).
VECTOR_ENTRY_POINT = "harbor_gym.vector:HarborVectorEnv"


def _register(env_id: str, entry_point: str, **kwargs: Any) -> None:
    if env_id in gym.registry:
        return
    gym.register(id=env_id, entry_point=entry_point, vector_entry_point=VECTOR_ENTRY_POINT, nondeterministic=True,
                 kwargs=kwargs or {})


def register_envs() -> None:
    """Register the generic ids and every shipped example (idempotent)."""
    from harbor_gym.examples import example_names, examples_dir

    _register(TASK_ID, "harbor_gym.env:HarborEnv")
    _register(DATASET_ID, "harbor_gym.env:HarborDatasetEnv")
    try:
        root = examples_dir()
        names = example_names()
    except FileNotFoundError:
        return
    for name in names:
        _register(example_id(name), "harbor_gym.env:HarborEnv", path=str(root / name))


def make(path_or_id: str | Path, **kwargs: Any) -> gym.Env:
    """The short way to an env: a task folder, a folder of task folders, a registered id, or a dataset by name.

    ``harbor_gym.make("envs/cake")`` is ``gymnasium.make("harbor_gym/HarborTask-v0", path="envs/cake")``. In this
    order: an existing folder (a task if it holds ``task.toml``, else a dataset); a registered Gymnasium id (or a
    ``module:Env`` string); ``NAME@VERSION``, a dataset of the registry in force (``config=`` kwarg, else the host
    settings file; `harbor_gym.datasets.resolve_dataset`). An existing path always wins over a registry name.

    Raises:
        TargetNotFoundError: ``path_or_id`` is none of these: "no such task folder or registered id: X".
        DatasetError: ``NAME@VERSION`` that the registry does not have or that cannot be fetched.
    """
    from harbor_gym.errors import TargetNotFoundError

    register_envs()
    path = Path(path_or_id)
    if path.is_dir():
        env_id = TASK_ID if (path / "task.toml").is_file() else DATASET_ID
        return gym.make(env_id, path=str(path), **kwargs)
    text = str(path_or_id)
    if text in gym.registry or ":" in text:
        return gym.make(text, **kwargs)
    from harbor_gym.datasets import resolve_dataset

    folder = resolve_dataset(text, kwargs.get("config"))
    if folder is not None:
        return gym.make(DATASET_ID, path=str(folder), **kwargs)
    raise TargetNotFoundError(f"no such task folder or registered id: {text}")
