"""Fixtures of the sandbox contract suite: a `sandbox_factory` parametrised over the backends, and the leak check.

``sandbox_factory(**spec_fields, settings=..., lease=...)`` starts a sandbox of the base image on the test's backend
and stops it at teardown. The ``local`` parameter needs ``harbor_gym.sandbox.local`` (written separately); until
it exists those tests are skipped with that reason.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import replace
from typing import Callable, Iterator

import pytest

from harbor_gym.config import host_settings
from harbor_gym.sandbox import MANAGED_LABEL, RUN_LABEL, Sandbox, SandboxSettings, SandboxSpec, lease as leases

BASE_IMAGE = "harbor-gym/base:bookworm"

#: Run ids of every sandbox the suite started (the leak check looks for exactly these).
SEEN_RUNS: set[str] = set()


def base_settings(**changes) -> SandboxSettings:
    """Host aliases, pull policy never, a short lease TTL and a small output cap, with ``changes``."""
    hs = host_settings()
    settings = SandboxSettings(
        pull_policy="never",
        image_aliases=dict(hs.image_aliases),
        rootfs_aliases=dict(hs.rootfs_aliases),
        lease_ttl_s=30.0,
        output_cap_bytes=4096,
    )
    return replace(settings, **changes) if changes else settings


#: The podman engines the suite used (``backend`` -> client), for the leak check.
PODMAN_CLIENTS: dict[str, object] = {}


def _backend_class(backend: str):
    if backend == "docker":
        from harbor_gym.sandbox.docker_backend import DockerSandbox

        return DockerSandbox
    if backend.startswith("podman"):
        from harbor_gym.sandbox.podman_backend import PodmanSandbox

        return PodmanSandbox
    try:
        module = importlib.import_module("harbor_gym.sandbox.local")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("harbor_gym.sandbox.local"):
            pytest.skip("harbor_gym.sandbox.local (the bubblewrap backend) is not written yet")
        raise
    return module.LocalSandbox


@pytest.fixture
def settings_with() -> Callable[..., SandboxSettings]:
    """`base_settings` as a fixture: ``settings_with(lease_ttl_s=3)``."""
    return base_settings


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker),
                        pytest.param("podman", marks=pytest.mark.podman),
                        pytest.param("podman-rootless", marks=pytest.mark.podman),
                        pytest.param("local", marks=pytest.mark.bwrap)])
def backend(request) -> str:
    """The backend under test: ``podman`` is rootful podman as harbor_gym finds or starts it, ``podman-rootless``
    the rootless user's service driven through its socket (issue 17 item 2)."""
    _backend_class(request.param)
    if request.param.startswith("podman"):
        fixture = "podman_rootless" if request.param == "podman-rootless" else "podman_rootful"
        PODMAN_CLIENTS[request.param] = request.getfixturevalue(fixture)
    return request.param


@pytest.fixture
def limit_applies(backend) -> Callable[[str], bool]:
    """``limit_applies("memory_mb")``: whether the backend applies that limit (False only where it documents it
    cannot: rootless podman on cgroup v1 refuses ``cpus``/``memory_mb`` and does not apply ``pids_limit``)."""
    client = PODMAN_CLIENTS.get(backend)
    if client is None:
        return lambda field: True
    from harbor_gym.sandbox._podman import engine_of

    return engine_of(client).can_limit


@pytest.fixture
def sandbox_factory(backend) -> Iterator[Callable[..., Sandbox]]:
    """Start sandboxes of the base image on ``backend``; every one is stopped at teardown."""
    made: list[Sandbox] = []
    cls = _backend_class(backend)
    client = PODMAN_CLIENTS.get(backend)

    def make(*, settings: SandboxSettings | None = None, lease: leases.Lease | None = None, **fields) -> Sandbox:
        fields.setdefault("image", BASE_IMAGE)
        fields.setdefault("name_hint", "contract")
        spec = SandboxSpec(**fields)
        kwargs = {"lease": lease} if lease is not None else {}
        if client is not None:
            kwargs["client"] = client
        sb = cls(spec, settings or base_settings(), **kwargs)
        made.append(sb)
        sb.start()
        run_id = getattr(sb, "run_id", None)
        if run_id:
            SEEN_RUNS.add(run_id)
        return sb

    yield make
    for sb in made:
        sb.stop()
    if client is not None:  # podman's services end with the session: look now
        _check_left(client, close=False)


@pytest.fixture(scope="session", autouse=True)
def _nothing_labelled_left() -> Iterator[None]:
    """After the session: no container, network or volume of this run carries the managed label."""
    yield
    if not SEEN_RUNS:
        return
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception:  # no engine: nothing of docker can be left
        return
    _check_left(client, close=True)


def _check_left(client, *, close: bool) -> None:
    """Fail if ``client``'s engine still holds labelled resources of this run (removing them first)."""
    try:
        deadline = time.monotonic() + 15
        while True:
            left = [  # the low-level list: a container removed meanwhile is not inspected (no race)
                (c.get("Names") or [c["Id"]])[0].lstrip("/")
                for c in client.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
                if (c.get("Labels") or {}).get(RUN_LABEL) in SEEN_RUNS
            ]
            left += [n.name for n in client.networks.list(filters={"label": f"{MANAGED_LABEL}=true"})
                     if n.attrs.get("Labels", {}).get(RUN_LABEL) in SEEN_RUNS]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if left:
            for name in left:  # do not leak into the next session either
                try:
                    client.api.remove_container(name, force=True)
                except Exception:
                    pass
            pytest.fail(f"labelled resources of this test run left behind: {left}")
    finally:
        if close:
            client.close()
