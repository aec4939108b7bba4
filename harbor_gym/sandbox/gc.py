"""``harbor-gym gc``: remove what crashed processes left behind, and nothing else.

A labelled container, network or volume (``io.harbor-gym.managed=true``) belongs to a run (``io.harbor-gym.run``).
It is garbage iff that run's lease is dead: its lease file is missing on this host (the run crashed, was released,
or is not of this host) or was not renewed within the container's lease TTL (``io.harbor-gym.lease-ttl``, else
the default). Resources of a live run are never touched, nor anything without the managed label. The shared
public network (``io.harbor-gym.shared``) belongs to no run: it is removed only while no container is on it. With
``images=True`` the build cache images (``io.harbor-gym.cache=build``) not used by a container are removed too.

The engine's lease reaper (`harbor_gym.sandbox._reaper`) carries no managed label: gc neither counts nor removes it.
It removes the resources of dead runs by itself within ``lease_ttl_s`` + 20 s, judging by the leases renewed into it
(any host's runs); gc judges a local engine's resources by this host's lease files, so run it where the trainers
run, and a remote engine's (``tcp://``, ``ssh://``; ``harbor-gym gc --engine URL``) by the leases in that engine's
reaper, so that another host's live run is never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox._engine import engine_key, get_client, is_remote
from harbor_gym.sandbox._reaper import LEASE_LABEL, lease_records
from harbor_gym.sandbox._netfilter import SHARED_LABEL
from harbor_gym.sandbox.base import MANAGED_LABEL, RUN_LABEL
from harbor_gym.sandbox.docker_backend import TTL_LABEL
from harbor_gym.sandbox.images import CACHE_LABEL
from harbor_gym.sandbox.lease import lease_is_live

if TYPE_CHECKING:
    import docker

__all__ = ["GcReport", "collect_garbage", "DEFAULT_TTL_S"]

log = logging.getLogger("harbor_gym.sandbox")

#: TTL assumed for a resource that does not carry `TTL_LABEL`.
DEFAULT_TTL_S = 60.0


@dataclass
class GcReport:
    """What `collect_garbage` removed (names), what it kept because its run is live, and what failed."""

    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    kept_live: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def removed(self) -> int:
        """How many resources were removed."""
        return len(self.containers) + len(self.networks) + len(self.volumes) + len(self.images)


#: A remote engine's lease is live while renewed within its TTL plus this allowance (as its reaper judges it).
REMOTE_ALLOWANCE_S = 10.0


def _ttl(labels: dict[str, str]) -> float:
    try:
        return float(labels.get(TTL_LABEL, DEFAULT_TTL_S))
    except ValueError:
        return DEFAULT_TTL_S


def _dead(labels: dict[str, str], remote: dict[str, str] | None = None, *, age_s: float | None = None) -> bool:
    """Whether a resource's run is dead: by this host's lease files, or for a remote engine (``remote``: its
    reaper's lease records) by the leases renewed into that engine, from any host. A remote resource whose lease
    is not (yet) recorded is dead only once older than its TTL."""
    run = labels.get(RUN_LABEL)
    if not run:
        return True
    ttl = _ttl(labels)
    if remote is None:
        return not lease_is_live(run, ttl)
    record = remote.get(labels.get(LEASE_LABEL) or run)
    if record is None:
        return age_s is not None and age_s > ttl + REMOTE_ALLOWANCE_S
    if record == "released":
        return True
    try:
        return time.time() - float(record) > ttl + REMOTE_ALLOWANCE_S
    except ValueError:
        return True


def collect_garbage(*, images: bool = False, client: "docker.DockerClient | None" = None) -> GcReport:
    """Remove labelled containers, networks and volumes whose run's lease is dead; with ``images`` also the build
    cache images. One failure does not stop the rest (it is listed in ``errors``).

    Raises:
        SandboxUnavailableError: no Docker engine answers.
    """
    import docker.errors
    import requests.exceptions

    client = client or get_client()
    api = client.api
    report = GcReport()
    selector = {"label": f"{MANAGED_LABEL}=true"}
    try:
        containers = api.containers(all=True, filters=selector)
        # A remote engine serves other hosts' runs, whose lease files are not here: judge by its reaper's leases
        remote = (lease_records(client) or {}) if is_remote(client) else None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxUnavailableError(f"gc: the Docker engine does not answer: {exc}", retryable=True) from exc
    if remote is not None:
        log.info("gc of remote engine %s: judged by the %d leases in its reaper", engine_key(client), len(remote))
    for c in containers:
        name = (c.get("Names") or [c["Id"][:12]])[0].lstrip("/")
        if not _dead(c.get("Labels") or {}, remote, age_s=time.time() - float(c.get("Created") or 0)):
            report.kept_live.append(name)
            continue
        try:
            api.remove_container(c["Id"], force=True, v=True)
            report.containers.append(name)
        except docker.errors.NotFound:
            report.containers.append(name)
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # removal already in progress
                report.containers.append(name)
            else:
                report.errors.append(f"container {name}: {exc}")
    for net in api.networks(filters=selector):
        name = net.get("Name") or net["Id"][:12]
        if SHARED_LABEL in (net.get("Labels") or {}):  # shared by every run (GYM-10): removed only while unused
            try:
                api.remove_network(net["Id"])
                report.networks.append(name)
            except docker.errors.APIError:  # in use: a live sandbox is on it
                report.kept_live.append(name)
            continue
        if not _dead(net.get("Labels") or {}, remote):
            report.kept_live.append(name)
            continue
        try:
            api.remove_network(net["Id"])
            report.networks.append(name)
        except docker.errors.APIError as exc:
            report.errors.append(f"network {name}: {exc}")
    for vol in (api.volumes(filters=selector) or {}).get("Volumes") or []:
        name = vol["Name"]
        if not _dead(vol.get("Labels") or {}, remote):
            report.kept_live.append(name)
            continue
        try:
            api.remove_volume(name)
            report.volumes.append(name)
        except docker.errors.APIError as exc:
            report.errors.append(f"volume {name}: {exc}")
    if images:
        for img in api.images(filters={"label": [f"{MANAGED_LABEL}=true", f"{CACHE_LABEL}=build"]}):
            tags = [t for t in (img.get("RepoTags") or []) if t != "<none>:<none>"]
            ref = tags[0] if tags else img["Id"]
            try:
                for tag in tags or [img["Id"]]:
                    api.remove_image(tag, noprune=False)
                report.images.append(ref)
            except docker.errors.NotFound:
                report.images.append(ref)
            except docker.errors.APIError as exc:  # in use by a container: keep
                report.errors.append(f"image {ref}: {exc.explanation or exc}")
    if report.removed:
        log.info("gc removed %d containers, %d networks, %d volumes, %d images", len(report.containers),
                 len(report.networks), len(report.volumes), len(report.images))
    return report
