"""Where the example task folders of ``envs/`` are: inside the installed wheel, else in the source checkout."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["examples_dir", "example_names"]


def examples_dir() -> Path:
    """The folder holding the shipped example task folders.

    An installed wheel carries them as ``harbor_gym/envs`` (found with ``importlib.resources``); an editable
    install of the source checkout finds the repository's ``envs/`` beside the package.

    Raises:
        FileNotFoundError: neither exists (a broken installation).
    """
    packaged = Path(str(importlib.resources.files("harbor_gym"))) / "envs"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "envs"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("the example task folders (envs/) are missing from this installation of harbor_gym")


def example_names() -> list[str]:
    """The ids of the shipped examples (folders holding a task.toml), sorted."""
    return sorted(p.name for p in examples_dir().iterdir() if (p / "task.toml").is_file())
