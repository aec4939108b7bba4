"""Shared test set-up: markers for tests that need real Docker, podman or bubblewrap, and leak checks.

A test marked ``docker`` (or ``podman``, ``bwrap``) is skipped with a clear reason where the engine (or bubblewrap and the local
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


#: The unprivileged user rootless podman runs as (scripts/setup-host.sh makes it).
PODMAN_USER = os.environ.get("HARBOR_GYM_PODMAN_USER", "hgpodman")


@functools.lru_cache(maxsize=1)
def podman_unavailable_reason() -> str | None:
    """None when podman is installed with the local base image in its rootful store and in the rootless user's
    (`PODMAN_USER`, with its XDG_RUNTIME_DIR), else why not. Starts no service (the tests' fixtures do)."""
    import pwd
    import subprocess

    if shutil.which("podman") is None:
        return "podman is not installed; run scripts/setup-host.sh"
    if os.geteuid() != 0:
        return "the podman tests drive rootful podman and the rootless user's service: they need root"
    try:
        user = pwd.getpwnam(PODMAN_USER)
    except KeyError:
        return f"the rootless podman user {PODMAN_USER} does not exist; run scripts/setup-host.sh"
    runtime = f"/run/user/{user.pw_uid}"
    if not os.path.isdir(runtime):
        return f"{runtime} (the rootless user's XDG_RUNTIME_DIR) is missing; run scripts/setup-host.sh"
    for who, argv in (("rootful", ["podman", "image", "exists", BASE_IMAGE]),
                      ("rootless", ["runuser", "-u", PODMAN_USER, "--", "env", f"XDG_RUNTIME_DIR={runtime}",
                                    f"HOME={user.pw_dir}", "podman", "image", "exists", BASE_IMAGE])):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
        if done.returncode != 0:
            return f"{who} podman lacks {BASE_IMAGE} ({done.stderr.strip()[-200:]}); run scripts/setup-host.sh"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, probe in (("docker", docker_unavailable_reason), ("bwrap", bwrap_unavailable_reason),
                              ("podman", podman_unavailable_reason)):
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
def _fail_missing_podman():
    pytest.fail(f"CI=true but {podman_unavailable_reason()}")


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


@pytest.fixture(scope="session")
def podman_rootful():
    """The process's podman client, as harbor_gym makes it: the rootful socket found, else harbor_gym's own
    service started (it stops by itself once this process is gone and nothing is left to reap)."""
    from harbor_gym.sandbox._podman import podman_client

    return podman_client()


@pytest.fixture(scope="session")
def podman_rootless():
    """A client of rootless podman as the unprivileged user `PODMAN_USER` runs it, driven from root through its
    socket (issue 17 item 2): harbor_gym's own service supervisor (`harbor_gym.sandbox._podman_service`, pure
    standard library, run by the system's python3 as that user) on the user's ``$XDG_RUNTIME_DIR/harbor-gym/
    podman/podman.sock``, kept alive by this process's share of its users lock. At the end the share is dropped
    and the supervisor must stop the service by itself (nothing leased is left by then)."""
    import fcntl
    import pwd
    import subprocess
    import time

    from harbor_gym.sandbox import _podman_service
    from harbor_gym.sandbox._podman import client_for

    user = pwd.getpwnam(PODMAN_USER)
    runtime = f"/run/user/{user.pw_uid}"
    folder = f"{runtime}/harbor-gym/podman"
    socket = f"{folder}/podman.sock"
    subprocess.run(["runuser", "-u", PODMAN_USER, "--", "mkdir", "-p", "-m", "0700", folder], check=True, cwd="/")
    users = os.open(f"{folder}/{_podman_service.USERS_LOCK}", os.O_RDWR | os.O_CREAT, 0o600)
    os.chown(f"{folder}/{_podman_service.USERS_LOCK}", user.pw_uid, user.pw_gid)
    fcntl.flock(users, fcntl.LOCK_SH)
    supervisor = subprocess.Popen(
        ["runuser", "-u", PODMAN_USER, "--", "env", f"XDG_RUNTIME_DIR={runtime}", f"HOME={user.pw_dir}",
         "/usr/bin/python3", _podman_service.__file__, "--socket", socket, "--podman", shutil.which("podman")],
        cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _podman_service.answers(socket):
            if time.monotonic() > deadline or supervisor.poll() is not None:
                raise RuntimeError(f"the rootless podman service did not start: {supervisor.stderr.read()[-500:]}")
            time.sleep(0.2)
        client = client_for(f"unix://{socket}", how="the rootless user's harbor_gym service")
        yield client
        client.close()
        os.close(users)  # the last user leaves: the supervisor stops the service once nothing leased is left
        users = -1
        supervisor.wait(120)
        assert not os.path.exists(socket), "the supervisor left its socket behind"
    finally:
        if users >= 0:
            os.close(users)
        if supervisor.poll() is None:
            supervisor.terminate()
            supervisor.wait(30)
