"""Podman as a sandbox engine (issue 17 item 2): its socket found or its service started, one shared Docker SDK
client per process, and what the engine can enforce.

harbor_gym drives podman through its Docker-compatible API with the same ``docker`` SDK as the Docker engine, so a
podman sandbox is a `DockerSandbox` whose client is `podman_client`. Where the engine's socket comes from, in order
(the first that answers; the choice is logged once, at INFO):

1. ``$CONTAINER_HOST`` (podman's own variable; ``unix://`` or ``tcp://``), and only it when it is set;
2. the rootful service's usual socket ``/run/podman/podman.sock`` (when running as root);
3. the rootless service's usual socket ``$XDG_RUNTIME_DIR/podman/podman.sock``;
4. harbor_gym's own service, ``podman system service --time=0`` on `own_socket` (``/run/harbor-gym/podman/
   podman.sock`` as root, else ``$XDG_RUNTIME_DIR/harbor-gym/podman/podman.sock``), joined when it runs, else
   started. It runs under a small supervisor (`_podman_service`, in its own session) that stops it once no
   harbor_gym process uses it any more (each holds a shared lock on ``users.lock`` beside the socket while it lives;
   the kernel drops it at exit, SIGKILL included) and nothing carrying a lease label is left for the reaper to
   remove: so the service stops after the last user's exit, and a SIGKILLed trainer's sandboxes are still reaped.

What podman 4.3's compat API lacks for harbor_gym, and what harbor_gym does instead (README "Podman"):

- limits: on cgroup v1, rootless podman applies no memory, cpu or pids limit and says so only in its own log;
  harbor_gym asks the engine which cgroup controllers it has (`PodmanEngine.controllers`, from the libpod info)
  and refuses a ``memory_mb`` or ``cpus`` it cannot apply (`SandboxUnavailableError`, LOAD-24: a refusal at seed);
  ``pids_limit`` (always the harness's guard, never a task's) is not applied there, logged once per engine;
- ``enable_icc=false`` is not a podman network option: podman sandboxes get a public network and host rules of
  their own (`_podman_net`);
- the size listing (``SizeRw``) fails on a btrfs layer over its quota: `storage_exceeded` then decides by a root
  write, as for Docker's simple quotas.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from harbor_gym.errors import SandboxUnavailableError

if TYPE_CHECKING:
    import docker

    from harbor_gym.sandbox.base import SandboxSpec

__all__ = ["PodmanEngine", "podman_client", "client_for", "engine_of", "is_podman", "own_socket", "libpod", "reaper_mount", "reaper_mount_current",
           "HealthcheckDriver", "healthcheck_driver",
           "unenforced", "limit_refusals", "warn_unapplied", "ROOTFUL_SOCKET", "LIMIT_CONTROLLERS"]

log = logging.getLogger("harbor_gym.sandbox")

#: The rootful service's usual socket (systemd's ``podman.socket``).
ROOTFUL_SOCKET = "/run/podman/podman.sock"
#: The cgroup controller each limit needs.
LIMIT_CONTROLLERS = {"cpus": "cpu", "memory_mb": "memory", "pids_limit": "pids"}
#: The libpod API version prefix (the compat prefix ``/v1.41`` is refused on libpod endpoints).
LIBPOD_PREFIX = "/v4.0.0/libpod"
#: Bound of waiting for a started service to answer.
START_TIMEOUT_S = 60.0
_CLIENT_TIMEOUT_S = 120
_MARK = "_harbor_gym_podman"

_lock = threading.Lock()
_client: "docker.DockerClient | None" = None
_client_pid: int | None = None
_users_fd: int | None = None  # this process's share of harbor_gym's own service (held until exit)
_users_fd_pid: int | None = None
_warned: set[str] = set()


@dataclass(frozen=True)
class PodmanEngine:
    """What harbor_gym knows of the podman service behind a client.

    Attributes:
        url: the service's address (``unix:///...`` or ``tcp://...``).
        how: where it was found (``CONTAINER_HOST``, ``rootful socket``, ``rootless socket``) or
            ``started by harbor_gym`` / ``harbor_gym's service`` (joined).
        rootless: the service runs as an unprivileged user.
        cgroup_version: ``"v1"`` or ``"v2"``.
        controllers: the cgroup controllers the engine can use for a container (empty: no limit applies).
        version: podman's version.
    """

    url: str
    how: str
    rootless: bool
    cgroup_version: str
    controllers: frozenset[str]
    version: str

    @property
    def socket_path(self) -> str | None:
        """The service's Unix socket path, or ``None`` for a ``tcp://`` service."""
        return self.url[len("unix://"):] if self.url.startswith("unix://") else None

    def can_limit(self, field: str) -> bool:
        """True iff the engine applies the limit named by a `SandboxSpec` field (``cpus``, ``memory_mb``,
        ``pids_limit``)."""
        return LIMIT_CONTROLLERS[field] in self.controllers

    def describe(self) -> str:
        """A short text for logs and messages (``rootless podman 4.3.1 on cgroup v1``)."""
        return f"{'rootless' if self.rootless else 'rootful'} podman {self.version} on cgroup {self.cgroup_version}"


def engine_of(client: Any) -> PodmanEngine | None:
    """The `PodmanEngine` of ``client`` if it talks to podman, else ``None``. Free: a client made by
    `podman_client` carries its engine; any other client counts as podman only when its cached ``docker info``
    (`harbor_gym.sandbox._engine.engine_info`) already shows podman's keys, so no request is ever added."""
    engine = getattr(client, _MARK, None)
    if engine is not None:
        return engine
    from harbor_gym.sandbox import _engine

    info = _engine._info.get(id(client))
    if info is not None and "BuildahVersion" in info:
        path = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
        engine = _probe(client, url=f"unix://{path}" if path else str(client.api.base_url),
                        how="a client given to harbor_gym")
        setattr(client, _MARK, engine)
        return engine
    return None


def is_podman(client: Any) -> bool:
    """True iff ``client`` talks to podman (see `engine_of`)."""
    return engine_of(client) is not None


def own_socket() -> Path:
    """The socket of harbor_gym's own podman service: ``/run/harbor-gym/podman/podman.sock`` as root, else under
    ``$XDG_RUNTIME_DIR``.

    Raises:
        SandboxUnavailableError: not root and ``XDG_RUNTIME_DIR`` is unset (rootless podman needs it).
    """
    if os.geteuid() == 0:
        return Path("/run/harbor-gym/podman/podman.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime:
        raise SandboxUnavailableError("rootless podman needs XDG_RUNTIME_DIR (a folder of this user's, mode 0700) "
                                      "to hold its service's socket; set it", field="backend")
    return Path(runtime) / "harbor-gym" / "podman" / "podman.sock"


def podman_client() -> "docker.DockerClient":
    """The process's shared Docker SDK client of the podman service (found or started, see the module docstring),
    created on first use and logged once. A forked child makes its own.

    Raises:
        SandboxUnavailableError: no podman here (not installed, no socket answers and none can be started), or
            ``CONTAINER_HOST`` names a service that does not answer (retryable).
    """
    global _client, _client_pid
    with _lock:
        if _client is not None and _client_pid == os.getpid():
            return _client
        client, engine = _connect()
        setattr(client, _MARK, engine)
        _client, _client_pid = client, os.getpid()
        atexit.register(_close, client)
        log.info("sandbox backend podman: %s at %s (%s)", engine.describe(), engine.url, engine.how)
        return client


def _close(client: Any) -> None:
    try:
        client.close()
    except Exception:  # exit path: nothing left to report to
        pass


def _connect() -> tuple["docker.DockerClient", PodmanEngine]:
    explicit = os.environ.get("CONTAINER_HOST")
    if explicit:
        if not explicit.startswith(("unix://", "tcp://")):
            raise SandboxUnavailableError(f"CONTAINER_HOST={explicit!r}: harbor_gym reaches podman through the "
                                          "Docker SDK, which speaks unix:// and tcp:// only", field="backend")
        client = _try(explicit)
        if client is None:
            raise SandboxUnavailableError(f"CONTAINER_HOST={explicit!r}: no podman service answers there",
                                          field="backend", retryable=True)
        return client, _probe(client, url=explicit, how="CONTAINER_HOST")
    candidates = []
    if os.geteuid() == 0:
        candidates.append((f"unix://{ROOTFUL_SOCKET}", "rootful socket"))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        candidates.append((f"unix://{runtime}/podman/podman.sock", "rootless socket"))
    for url, how in candidates:
        if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
            continue
        client = _try(url)
        if client is not None:
            return client, _probe(client, url=url, how=how)
    socket = own_socket()
    started = _join_or_start(socket)
    url = f"unix://{socket}"
    client = _try(url)
    if client is None:
        raise SandboxUnavailableError(f"harbor_gym's podman service at {socket} stopped answering right after "
                                      "it started", field="backend", retryable=True)
    return client, _probe(client, url=url, how="started by harbor_gym" if started else "harbor_gym's service")


def client_for(url: str, *, how: str = "given") -> "docker.DockerClient":
    """A new Docker SDK client of the podman service at ``url`` (``unix://`` or ``tcp://``), carrying its
    `PodmanEngine` (`engine_of`); the caller closes it. For a service of one's own choosing, e.g. another user's
    rootless service driven from root through its socket.

    Raises:
        SandboxUnavailableError: nothing answers there, or it is not podman.
    """
    client = _try(url)
    if client is None:
        raise SandboxUnavailableError(f"no podman service answers at {url}", field="backend", retryable=True)
    setattr(client, _MARK, _probe(client, url=url, how=how))
    return client


def _try(url: str) -> "docker.DockerClient | None":
    """A client of ``url`` if a podman service answers there (its version names the Podman Engine), else None."""
    import docker

    try:
        client = docker.DockerClient(base_url=url, timeout=_CLIENT_TIMEOUT_S, max_pool_size=64)
    except docker.errors.DockerException:
        return None
    try:
        version = client.version()
    except Exception:  # it does not answer: not this one
        client.close()
        return None
    if not any(c.get("Name") == "Podman Engine" for c in version.get("Components") or []):
        client.close()
        raise SandboxUnavailableError(f"{url} is not a podman service (it answers as "
                                      f"{version.get('Platform', {}).get('Name') or 'another engine'}); "
                                      "unset CONTAINER_HOST or point it at podman", field="backend")
    return client


def libpod(client: Any, method: str, path: str, **kwargs: Any) -> Any:
    """One request to podman's own (libpod) API through ``client``'s session, e.g. ``libpod(c, "GET", "/info")``.

    Returns the decoded JSON (``None`` for an empty body). Raises the SDK's ``APIError`` for an error status."""
    api = client.api
    url = api.base_url + LIBPOD_PREFIX + path
    if method == "GET":
        response = api._get(url, **kwargs)
    elif method == "DELETE":
        response = api._delete(url, **kwargs)
    else:
        response = api._post_json(url, data=kwargs.pop("json", None), **kwargs)
    api._raise_for_status(response)
    return response.json() if response.content else None


def _probe(client: Any, *, url: str, how: str) -> PodmanEngine:
    try:
        info = libpod(client, "GET", "/info")
    except Exception as exc:
        raise SandboxUnavailableError(f"podman at {url or 'the given client'} does not answer its info request: "
                                      f"{exc}", field="backend", retryable=True) from exc
    host = info.get("host") or {}
    return PodmanEngine(url=url, how=how, rootless=bool((host.get("security") or {}).get("rootless")),
                        cgroup_version=str(host.get("cgroupVersion") or "v1"),
                        controllers=frozenset(host.get("cgroupControllers") or ()),
                        version=str((info.get("version") or {}).get("Version") or "?"))


# --- harbor_gym's own service -------------------------------------------------------------------------------------
def _join_or_start(socket: Path) -> bool:
    """Hold a user's share of harbor_gym's service at ``socket`` for this process's life, starting it (under its
    supervisor) if it does not answer. Returns True iff this call started it.

    Raises:
        SandboxUnavailableError: podman is not installed, or the service did not answer within `START_TIMEOUT_S`.
    """
    global _users_fd, _users_fd_pid
    from harbor_gym.sandbox import _podman_service as svc

    folder = socket.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if _users_fd is None or _users_fd_pid != os.getpid():
        fd = os.open(folder / svc.USERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a supervisor is deciding to stop (it holds it exclusively)
        _users_fd, _users_fd_pid = fd, os.getpid()
    if svc.answers(str(socket)):
        return False
    with _flocked(folder / svc.START_LOCK):
        if svc.answers(str(socket)):
            return False
        binary = svc.podman_binary()
        if binary is None:
            raise SandboxUnavailableError("podman is not installed (no `podman` on PATH); scripts/setup-host.sh "
                                          "installs Debian's", field="backend")
        log_path = folder / "service.log"
        with open(log_path, "ab") as out:
            subprocess.Popen([sys.executable, svc.__file__, "--socket", str(socket), "--podman", binary],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                             close_fds=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not svc.answers(str(socket)):
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-1000:] if log_path.exists() else ""
                raise SandboxUnavailableError(f"`podman system service` did not answer at {socket} within "
                                              f"{START_TIMEOUT_S:g} s; its log ({log_path}) ends: {tail}",
                                              field="backend", retryable=True)
            time.sleep(0.2)
    return True


class _flocked:
    """An exclusive ``flock`` on ``path`` for a ``with`` block."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_flocked":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


# --- the reaper -------------------------------------------------------------------------------------------------
#: Where the reaper container sees the folder of podman's socket.
REAPER_ENGINE_DIR = "/run/harbor-gym-engine"


def reaper_mount(client: Any) -> tuple[dict[str, dict[str, str]], dict[str, str]] | None:
    """The binds and environment giving podman's reaper container its engine (``None`` for a Docker engine, or when
    ``HARBOR_GYM_REAPER_SOCKET`` names the socket explicitly).

    The socket's folder is mounted, not the socket: a service restarted on the same path (harbor_gym's own stops
    when unused, `_podman_service`) makes a new socket file, which a file bind would not follow.

    Raises:
        SandboxUnavailableError: a ``tcp://`` podman service without ``HARBOR_GYM_REAPER_SOCKET``.
    """
    engine = engine_of(client)
    if engine is None or os.environ.get("HARBOR_GYM_REAPER_SOCKET"):
        return None
    path = engine.socket_path
    if path is None:
        raise SandboxUnavailableError(f"podman at {engine.url}: its lease reaper needs the service's Unix socket "
                                      "path on the engine's host; set HARBOR_GYM_REAPER_SOCKET", field="backend")
    folder, name = os.path.split(path)
    return ({folder: {"bind": REAPER_ENGINE_DIR, "mode": "rw"}},
            {"HARBOR_GYM_REAPER_ENGINE_SOCKET": f"{REAPER_ENGINE_DIR}/{name}"})


def reaper_mount_current(client: Any, attrs: dict) -> bool:
    """False iff ``client`` is podman and the reaper container ``attrs`` (an inspect) does not mount the folder of
    the engine's current socket (it was made through another service's socket: it could reach no engine)."""
    mount = reaper_mount(client) if engine_of(client) is not None else None
    if mount is None:
        return True
    (folder,) = mount[0]
    return any(m.get("Source") == folder and m.get("Destination") == REAPER_ENGINE_DIR
               for m in attrs.get("Mounts") or [])


# --- healthchecks -----------------------------------------------------------------------------------------------
class HealthcheckDriver:
    """Runs a container's healthcheck through podman's libpod API at its interval (podman schedules healthchecks
    with systemd timers, so without systemd a compose service's ``State.Health`` would stay ``starting``).

    Call it from a wait loop: a check runs when one is due (the first at once); its result updates the
    container's health as the engine's own run would (``healthy`` after a pass, ``unhealthy`` after ``retries``
    failures). Errors are left to the wait loop's inspect (a dead container, no healthcheck)."""

    def __init__(self, client: Any, container_id: str, interval_s: float) -> None:
        self.client = client
        self.container_id = container_id
        self.interval_s = max(0.5, interval_s)
        self._last: float | None = None

    def __call__(self) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval_s:
            return
        self._last = now
        try:
            libpod(self.client, "GET", f"/containers/{self.container_id}/healthcheck")
        except Exception as exc:  # the inspect that follows says what happened to the container
            log.debug("podman healthcheck run of %s failed: %s", self.container_id[:12], exc)


def healthcheck_driver(client: Any, container_id: str, interval_s: float) -> HealthcheckDriver | None:
    """A `HealthcheckDriver` on podman, ``None`` on Docker (whose engine runs healthchecks itself)."""
    return HealthcheckDriver(client, container_id, interval_s) if engine_of(client) is not None else None


# --- limits ---------------------------------------------------------------------------------------------------
def unenforced(spec: "SandboxSpec", engine: PodmanEngine) -> Iterator[tuple[str, Any]]:
    """The limits of ``spec`` (field, value) that ``engine`` cannot apply (pure)."""
    for field in LIMIT_CONTROLLERS:
        value = getattr(spec, field)
        if value is not None and not engine.can_limit(field):
            yield field, value


def limit_refusals(spec: "SandboxSpec", engine: PodmanEngine) -> list[str]:
    """LOAD-24, pure: why ``spec`` cannot run on ``engine`` as asked — one text per ``cpus``/``memory_mb`` it cannot
    apply (``pids_limit`` is the harness's guard, not a task's: see `warn_unapplied`). Empty when it can."""
    return [f"{field}={value} cannot be applied: {engine.describe()} has no '{LIMIT_CONTROLLERS[field]}' cgroup "
            "controller for its containers (rootless podman on cgroup v1 applies no limit at all)"
            for field, value in unenforced(spec, engine) if field != "pids_limit"]


def warn_unapplied(spec: "SandboxSpec", engine: PodmanEngine) -> None:
    """Log once per engine that ``spec``'s ``pids_limit`` is not applied there (README "Podman")."""
    if spec.pids_limit is None or engine.can_limit("pids_limit"):
        return
    key = f"{engine.url}|pids"
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("podman (%s): pids_limit=%s is not applied: the engine has no pids cgroup controller, so nothing "
                "but the user's RLIMIT_NPROC holds a fork bomb in its sandboxes", engine.describe(), spec.pids_limit)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
