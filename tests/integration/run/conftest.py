"""Fixtures for the ``harbor-gym run`` tests: small datasets and leak checks by label."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from run_helpers import ENVS, labelled


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A dataset folder holding copies of envs/cake and envs/gated-counter."""
    root = tmp_path / "dataset"
    root.mkdir()
    for name in ("cake", "gated-counter"):
        shutil.copytree(ENVS / name, root / name)
    return root


@pytest.fixture
def no_leaks(docker_client):
    """Nothing labelled with this process's test label is left once the test is done."""
    yield
    left = labelled(docker_client)
    for c in left:
        docker_client.api.remove_container(c["Id"], force=True)
    assert left == [], f"containers left behind: {[c['Names'] for c in left]}"
