"""The Docker engine connection: one shared SDK client per process (or the episode's engine, `engine_scope`), the
engine probe, request counting and the one place where Docker SDK errors become harbor_gym errors.

Library code talks to the engine only through the Docker SDK (never the docker CLI).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NoReturn

from harbor_gym.errors import SandboxError, SandboxPathError, SandboxUnavailableError

if TYPE_CHECKING:
    import docker

__all__ = ["get_client", "default_client", "engine_scope", "scoped_client", "engine_key", "engine_identity",
           "is_remote", "engine_answers", "RequestCounter", "count_requests", "translate_error", "engine_info", "StorageSupport",
           "storage_driver_support", "storage_support", "STORAGE_NEEDS"]

log = logging.getLogger("harbor_gym.sandbox")

_lock = threading.Lock()
_client: "docker.DockerClient | None" = None
_client_pid: int | None = None
_probe: dict[int, str | None] = {}
_info: dict[int, dict] = {}
_storage: dict[str, "StorageSupport"] = {}

#: What an engine needs so that a sandbox's writable size can be bounded (GYM-10), for messages and the README.
STORAGE_NEEDS = ("a storage driver that enforces `--storage-opt size`: overlay2 on an xfs data root mounted with "
                 "pquota (prjquota), or btrfs with quotas, zfs or devicemapper")

#: Bound of ordinary engine requests (builds and execs carry their own bounds).
REQUEST_TIMEOUT_S = 120.0


#: The engine client of the episode being seeded or run in this context (`engine_scope`), else None.
_scope: contextvars.ContextVar["docker.DockerClient | None"] = contextvars.ContextVar("harbor_gym_engine",
                                                                                       default=None)


@contextlib.contextmanager
def engine_scope(client: "docker.DockerClient | None") -> Iterator[None]:
    """Within the block (in this thread or task), `get_client` returns ``client``: every sandbox, compose group
    and image made there uses that engine (``EnvConfig.engines``, `harbor_gym.sandbox.engines`). ``None`` changes
    nothing. A sandbox binds its client when it is constructed, so it keeps its engine outside the block."""
    if client is None:
        yield
        return
    token = _scope.set(client)
    try:
        yield
    finally:
        _scope.reset(token)


def scoped_client() -> "docker.DockerClient | None":
    """The client of the enclosing `engine_scope`, else ``None``."""
    return _scope.get()


def engine_key(client: Any) -> str:
    """A text naming the engine ``client`` talks to (its URL; for a unix socket, the socket's path)."""
    adapter = getattr(getattr(client, "api", None), "_custom_adapter", None)
    path = getattr(adapter, "socket_path", None)
    if path:
        return f"unix://{path}"
    base = str(getattr(getattr(client, "api", None), "base_url", ""))
    for scheme in ("http://", "https://"):  # the SDK's spelling of a tcp:// Docker host
        if base.startswith(scheme):
            return "tcp://" + base[len(scheme):]
    return base


def engine_identity(client: Any, info: Mapping[str, Any]) -> str:
    """A cache key for the engine ``client`` talks to, given its ``docker info``: URL and engine ID (two engines of
    one host share an ID, read from the host's /etc/docker/key.json, so the ID alone does not tell them apart)."""
    return f"{engine_key(client)}|{info.get('ID') or id(client)}"


def is_remote(client: Any) -> bool:
    """True iff ``client`` reaches its engine over the network (``tcp://``, ``ssh://``): the engine's host is not
    known to be this one, so nothing of this host's filesystem may be bind-mounted there (issue 17)."""
    adapter = getattr(getattr(client, "api", None), "_custom_adapter", None)
    if adapter is not None and getattr(adapter, "socket_path", None):
        return False
    base = str(getattr(getattr(client, "api", None), "base_url", ""))
    return not base.startswith("http+docker://") or "ssh" in type(adapter).__name__.lower()


def get_client() -> "docker.DockerClient":
    """The client of the enclosing `engine_scope` if any, else the process's shared Docker SDK client (from the
    environment: ``DOCKER_HOST`` etc.), created on first use.

    A forked child gets its own client (sockets are not shared across a fork).

    Raises:
        SandboxUnavailableError: the Docker SDK cannot build a client (no engine configured).
    """
    scoped = _scope.get()
    if scoped is not None:
        return scoped
    return default_client()


def default_client() -> "docker.DockerClient":
    """The process's shared Docker SDK client of the engine the environment names, whatever scope is in force.

    Raises:
        SandboxUnavailableError: the Docker SDK cannot build a client (no engine configured).
    """
    global _client, _client_pid
    with _lock:
        if _client is None or _client_pid != os.getpid():
            import docker

            try:
                _client = docker.from_env(timeout=int(REQUEST_TIMEOUT_S), max_pool_size=64)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailableError(f"no Docker engine: {exc}", field="backend", retryable=True) from exc
            _client_pid = os.getpid()
            # Registered after the first use, so it runs after (atexit is LIFO) the lease's stop_all, which still
            # needs the client; closing it releases its pooled engine sockets (no ResourceWarning at exit).
            atexit.register(_close_client, _client)
        return _client


def _close_client(client: "docker.DockerClient") -> None:
    """Close ``client`` at interpreter exit (best effort)."""
    try:
        client.close()
    except Exception:  # exit path: nothing left to report to
        pass


def engine_answers(client: "docker.DockerClient | None" = None) -> str | None:
    """``None`` if a Docker engine answers a ping, else the reason why not. Cached per process (and client)."""
    key = id(client) if client is not None else os.getpid()
    with _lock:
        if key in _probe:
            return _probe[key]
    try:
        import docker

        probe_client = client or docker.from_env(timeout=5)
        try:
            probe_client.ping()
        finally:
            if client is None:
                probe_client.close()
        reason = None
    except Exception as exc:  # any failure to reach the engine means "no engine here"
        reason = f"{type(exc).__name__}: {exc}"
    with _lock:
        _probe[key] = reason
    return reason


def engine_info(client: "docker.DockerClient") -> dict:
    """``docker info`` of the engine behind ``client`` (cached per client)."""
    key = id(client)
    with _lock:
        cached = _info.get(key)
    if cached is None:
        cached = client.api.info()
        with _lock:
            _info[key] = cached
    return cached


@dataclass(frozen=True)
class StorageSupport:
    """Whether an engine bounds a container's writable size through ``storage_opt={"size": ...}`` (GYM-10).

    Attributes:
        reason: ``None`` when it does; else why not (naming the driver and what it needs).
        includes_image: the size also counts the image's own bytes (btrfs qgroups limit the container's whole
            subvolume), so a writable bound of N MiB is a size of N MiB plus the image's size.
    """

    reason: str | None
    includes_image: bool = False

    @property
    def supported(self) -> bool:
        """True iff a storage size can be applied."""
        return self.reason is None


def storage_driver_support(info: Mapping[str, Any]) -> StorageSupport:
    """GYM-10, pure: what ``docker info`` says of the storage driver's size limits (a probe create confirms it).

    overlay2 needs an xfs backing filesystem (and the ``pquota`` mount option, which only a create reveals);
    btrfs, zfs and devicemapper bound size natively (btrfs counting the image inside the limit)."""
    driver = str(info.get("Driver", ""))
    status = {str(k): str(v) for k, v in (info.get("DriverStatus") or [])}
    if driver == "overlay2":
        backing = status.get("Backing Filesystem", "")
        if backing.lower() == "xfs":
            return StorageSupport(None)
        return StorageSupport(f"the engine's storage driver is overlay2 on {backing or 'an unknown filesystem'}, "
                              f"which cannot bound a container's size; it needs {STORAGE_NEEDS}")
    if driver == "btrfs":
        # Full qgroups charge a container's subvolume for the image's extents it shares; simple quotas (Linux 6.7+,
        # what scripts/setup-host.sh enables) charge only what the container itself writes.
        simple = btrfs_simple_quota(str(info.get("DockerRootDir") or ""))
        return StorageSupport(None, includes_image=not simple)
    if driver in ("zfs", "devicemapper", "windowsfilter"):
        return StorageSupport(None)
    return StorageSupport(f"the engine's storage driver {driver or '(unknown)'} cannot bound a container's size; "
                          f"it needs {STORAGE_NEEDS}")


def btrfs_simple_quota(root_dir: str) -> bool:
    """Whether ``root_dir`` (an engine's data root, when it is on this host) lies on a btrfs filesystem with simple
    quotas enabled (``/sys/fs/btrfs/<fsid>/features/simple_quota``). ``False`` when unknown (a remote engine, no
    such folder here): limits are then taken to count the image too, the full-qgroup behaviour."""
    if not root_dir or not os.path.isdir(root_dir):
        return False
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as table:
            mounts = [line.split() for line in table]
    except OSError:
        return False
    best = ("", "")
    for fields in mounts:
        if len(fields) >= 3 and fields[2] == "btrfs":
            point = fields[1]
            if (root_dir == point or root_dir.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
                best = (point, fields[0])
    device = os.path.basename(best[1])
    if not device:
        return False
    sysfs = "/sys/fs/btrfs"
    try:
        for fsid in os.listdir(sysfs):
            if os.path.exists(os.path.join(sysfs, fsid, "devices", device)):
                return os.path.exists(os.path.join(sysfs, fsid, "features", "simple_quota"))
    except OSError:
        return False
    return False


def storage_support(client: "docker.DockerClient") -> StorageSupport:
    """GYM-10: whether this engine bounds a container's writable size, decided once per engine (by its id).

    Judged from ``docker info`` (`storage_driver_support`), then confirmed by creating (never starting) one
    labelled container with a small size from an image already present, and removing it: overlay2 on xfs
    without ``pquota``, or btrfs without quota support, refuse only then. Without any local image the
    ``docker info`` judgement stands.

    Raises:
        SandboxUnavailableError: the engine does not answer (retryable).
    """
    try:
        info = engine_info(client)
    except Exception as exc:
        translate_error(exc, what="read the engine's storage driver")
    key = engine_identity(client, info)
    with _lock:
        known = _storage.get(key)
    if known is not None:
        return known
    judged = storage_driver_support(info)
    if judged.supported:
        judged = _probe_storage(client, judged)
    with _lock:
        _storage[key] = judged
    return judged


def _probe_storage(client: "docker.DockerClient", judged: StorageSupport) -> StorageSupport:
    import docker.errors

    api = client.api
    try:
        present = api.images(filters={"dangling": False})
    except Exception as exc:
        translate_error(exc, what="list images for the storage probe")
    if not present:
        return judged
    image = present[0]
    size_mb = 64 + (int(image.get("Size") or 0) >> 20 if judged.includes_image else 0)
    cid = None
    try:
        cid = api.create_container(image["Id"], command=["true"], entrypoint=[],
                                   labels={"io.harbor-gym.managed": "true", "io.harbor-gym.probe": "storage"},
                                   host_config=api.create_host_config(network_mode="none",
                                                                      storage_opt={"size": f"{size_mb}M"}))["Id"]
    except docker.errors.NotFound:  # the image went away meanwhile (gc): the docker info judgement stands
        return judged
    except docker.errors.APIError as exc:
        text = str(getattr(exc, "explanation", "") or exc)
        if exc.status_code is not None and exc.status_code >= 500 and "storage" not in text.lower() \
                and "quota" not in text.lower():
            translate_error(exc, what="probe the engine's storage limits")
        return StorageSupport(f"the engine refused a storage size ({text.strip()[:300]}); it needs {STORAGE_NEEDS}")
    except Exception as exc:
        translate_error(exc, what="probe the engine's storage limits")
    finally:
        if cid is not None:
            try:
                api.remove_container(cid, force=True)
            except Exception as exc:  # labelled and never started: harbor-gym gc removes it
                log.warning("storage probe: removing container %s failed: %s", cid[:12], exc)
    return judged


@dataclass
class RequestCounter:
    """Counts the HTTP requests an SDK client sends to the engine (installed with `count_requests`)."""

    count: int = 0
    paths: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self.paths.clear()

    def _hook(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.count += 1
            try:
                self.paths.append(f"{response.request.method} {response.request.path_url}")
            except AttributeError:  # pragma: no cover - a response without its request
                pass
        return response


def count_requests(client: "docker.DockerClient") -> RequestCounter:
    """Install a counter of every HTTP request ``client`` sends to the engine and return it.

    Works on the SDK's ``APIClient`` (a ``requests.Session``): a response hook sees every request, streaming ones
    (attached execs, archives, builds) included.
    """
    counter = RequestCounter()
    client.api.hooks.setdefault("response", []).append(counter._hook)
    return counter


def translate_error(exc: BaseException, *, what: str, sandbox: str | None = None, path: str | None = None) -> NoReturn:
    """Raise the harbor_gym error for a Docker SDK / transport error ``exc`` raised while doing ``what``.

    404 on a path -> `SandboxPathError`; 404 on the container -> `SandboxError` (the sandbox is gone);
    connection failures -> `SandboxUnavailableError` (retryable); anything else -> `SandboxError`.
    """
    import docker.errors
    import requests.exceptions

    where = f"sandbox {sandbox}: " if sandbox else ""
    if isinstance(exc, docker.errors.NotFound):
        explanation = str(getattr(exc, "explanation", "") or exc)
        if path is not None and "no such container" not in explanation.lower():
            raise SandboxPathError(f"{where}{what}: no such path in the sandbox", path=path) from exc
        raise SandboxError(f"{where}{what}: the sandbox is gone ({explanation})", retryable=True) from exc
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError)):
        raise SandboxUnavailableError(f"{where}{what}: the Docker engine does not answer ({exc})",
                                      retryable=True) from exc
    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
        raise SandboxError(f"{where}{what}: the Docker engine did not answer in time ({exc})",
                           retryable=True) from exc
    if isinstance(exc, docker.errors.APIError):
        explanation = str(getattr(exc, "explanation", "") or exc)
        retry = exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 409)
        raise SandboxError(f"{where}{what}: {explanation}", retryable=retry) from exc
    raise SandboxError(f"{where}{what}: {type(exc).__name__}: {exc}") from exc
