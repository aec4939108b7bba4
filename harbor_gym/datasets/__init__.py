"""Datasets by name: ``NAME@VERSION`` through a registry file in Harbor's ``registry.json`` format.

``resolve_dataset("demo@1.0", config)`` reads the registry in force (`EnvConfig.registry`, else the host settings
file's ``registry``), fetches the dataset's repositories once into a content-addressed cache (commits verified) and
returns the local folder of task folders, which loads like any dataset folder (`harbor_gym.task.load_dataset`).
``harbor_gym.make`` and ``harbor-gym run`` use it for a target that is not an existing path: an existing path always
wins over a registry name.
"""

from __future__ import annotations

from pathlib import Path

from harbor_gym.config import EnvConfig
from harbor_gym.datasets._cache import MANIFEST, cache_root, dataset_key, materialize
from harbor_gym.datasets._registry import (
    DatasetRef,
    RegistryDataset,
    RegistryTask,
    find_dataset,
    parse_dataset_ref,
    read_registry,
)
from harbor_gym.errors import DatasetError

__all__ = [
    "MANIFEST",
    "DatasetRef",
    "RegistryDataset",
    "RegistryTask",
    "cache_root",
    "dataset_key",
    "find_dataset",
    "materialize",
    "parse_dataset_ref",
    "read_registry",
    "resolve_dataset",
]


def resolve_dataset(name: str, config: EnvConfig | None = None) -> Path | None:
    """The local folder of the dataset ``name`` (``NAME@VERSION``), or ``None`` when ``name`` is not of that shape.

    Raises:
        DatasetError: ``name`` has that shape but no registry is configured, the registry has no such dataset, or
            it cannot be fetched (see `materialize`).
    """
    ref = parse_dataset_ref(name)
    if ref is None:
        return None
    source = EnvConfig.coerce(config).effective_registry()
    if not source:
        raise DatasetError(f"{name} looks like a dataset name but no registry is configured; set EnvConfig.registry "
                           "or `registry = \"...\"` in the host settings file (a registry.json path or URL)",
                           field="registry")
    return materialize(find_dataset(ref, source))
