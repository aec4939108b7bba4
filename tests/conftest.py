"""Shared test set-up: markers for tests that need real Docker or bubblewrap, and leak checks.

A test marked ``docker`` (or ``bwrap``) is skipped with a clear reason where the engine (or bubblewrap and the local
base rootfs) is missing, but under ``CI=true`` a missing one is a failure: CI has them and must run every test.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

from harbor_gym.config import host_settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BASE_IMAGE = "harbor-gym/base:bookworm"
REPO_ROOT = Path(__file__).resolve().parents[1]
ENVS_DIR = REPO_ROOT / "envs"


@functools.lru_cache(maxsize=1)
def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers and has the local base image, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "no engine here"
        return f"no Docker engine answers ({exc.__class__.__name__}: {exc}); run scripts/setup-host.sh"
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        return f"the local base image {BASE_IMAGE} is missing; run scripts/setup-host.sh"
    finally:
        client.close()
    return None


@functools.lru_cache(maxsize=1)
def bwrap_unavailable_reason() -> str | None:
    """None when bubblewrap and the local base rootfs are there, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; run scripts/setup-host.sh"
    rootfs = host_settings().rootfs_aliases.get(BASE_IMAGE)
    if not rootfs or not Path(rootfs).is_dir():
        return f"no rootfs folder for {BASE_IMAGE} in the host settings; run scripts/setup-host.sh"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, probe in (("docker", docker_unavailable_reason), ("bwrap", bwrap_unavailable_reason)):
            if item.get_closest_marker(marker) is None:
                continue
            reason = probe()
            if reason is None:
                continue
            if IN_CI:
                # Under CI a missing engine must fail loudly, never pass as a skip.
                item.add_marker(pytest.mark.usefixtures("_fail_missing_" + marker))
            else:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def _fail_missing_docker():
    pytest.fail(f"CI=true but {docker_unavailable_reason()}")


@pytest.fixture
def _fail_missing_bwrap():
    pytest.fail(f"CI=true but {bwrap_unavailable_reason()}")


@pytest.fixture(scope="session")
def docker_client():
    """A Docker SDK client for tests that inspect the engine directly (e.g. to count what is left)."""
    import docker

    client = docker.from_env(timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="session")
def envs_dir() -> Path:
    """The repository's example task folders."""
    return ENVS_DIR
