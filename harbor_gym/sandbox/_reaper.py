"""The engine-side reaper: one container per Docker engine that removes the sandboxes of dead runs (SPEC GYM-10,
issue 12 item 6; README P3).

Why: a sandbox must disappear after its trainer's death (SIGKILL, OOM killer, a lost host) without relying on any
process inside the sandbox (a root agent can ``kill -STOP -1`` or replace it) nor on a host file bind-mounted into
it (which cannot work with a remote engine). So the lease lives beside the engine, not in the sandbox:

- **The reaper** is the container `REAPER_NAME` (``harbor-gym-reaper-<hash of its program>``), one per engine and
  harbor_gym version (so that processes of two versions never fight over one reaper; each reaper removes only
  resources labelled `REAPED_BY_LABEL` with its name, and an old version's reaper is removed once no resource names
  it), created on first use by any harbor_gym process from `REAPER_IMAGE` (through ``image_aliases``; it needs
  only ``python3``), with restart policy ``unless-stopped``, no network, and the engine's socket mounted. Its
  program is `_reaper_script` (pure standard library), uploaded with ``put_archive`` before the container starts.
  Every 2 s it starts removing (each removal in its own thread, so a slow one holds up none) every container,
  network and volume labelled `LEASE_LABEL` whose lease is stale (not renewed for the resource's ``lease_ttl_s``
  plus 10 s allowed for a loaded engine's delay in applying a renewal, plus twice the slowest archive upload the
  reaper measured on the engine in the last two minutes: an overloaded engine delays removal rather than removing
  a live run's sandbox).
  It carries neither ``io.harbor-gym.managed`` nor ``EnvConfig.labels``: it is not a sandbox, so ``harbor-gym gc``
  and leak censuses neither count nor remove it.
- **A run's lease** is the file ``/leases/<run_id>`` inside the reaper. `EngineLease` (one per lease and engine,
  attached by `attach` when the first Docker sandbox of the run starts) rewrites it through the engine API every
  quarter TTL from a daemon thread of the trainer process; `Lease.release` writes ``released`` (whatever is left is
  removed at the next pass); `Lease.pause` stops the renewals.
- **Bound:** a sandbox of a run whose process died is removed within ``lease_ttl_s`` + 10 s (latency allowance) +
  the reaper's poll (2 s) + the engine's removal time: within ``lease_ttl_s`` + 20 s on an engine that applies an
  archive upload within a few seconds (on a slower one, later by twice its upload time).

When the reaper dies: the engine restarts it (restart policy; its lease files are kept in its writable layer), also
after an engine restart. If it is removed or stopped (``docker rm -f``, ``docker stop``), the next renewal of any
live harbor_gym process notices (a failed write, or the periodic inspect) and recreates or restarts it; a new
reaper gives resources without a lease file one TTL of grace from its start. While no reaper runs, nothing is
removed by lease (``harbor-gym gc`` still removes the resources of dead runs of this host).

Engines: the socket mounted into the reaper is the one ``EnvConfig.engine_sockets`` names for the engine
(`harbor_gym.sandbox.engines`), else ``HARBOR_GYM_REAPER_SOCKET``, else the client's own unix socket, else the engine
host's ``/var/run/docker.sock``; a remote engine (``tcp://``, ``ssh://``) is reached the same way, since the reaper
runs on it. A socket that reaches another engine would have the reaper judge that engine's resources by these
leases, so the reaper checks at every start that its socket knows its own container and never reaps otherwise, and
the process that creates it asks it once (``--check-engine``) and refuses, naming the setting. On podman the socket's folder is mounted (`_podman.reaper_mount`: a
service restarted on the same path makes a new socket file), and a reaper whose folder is not the current
socket's is recreated.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox import _reaper_script
from harbor_gym.sandbox._docker_exec import read_all
from harbor_gym.sandbox._engine import engine_key
from harbor_gym.sandbox.base import SandboxSettings

if TYPE_CHECKING:
    import docker

    from harbor_gym.sandbox.lease import Lease

__all__ = ["REAPER_NAME", "REAPER_LABEL", "REAPER_IMAGE", "LEASE_LABEL", "REAPED_BY_LABEL", "EngineLease", "attach",
           "ensure_reaper", "reaper_socket", "lease_labels", "lease_records"]

log = logging.getLogger("harbor_gym.sandbox")

_SCRIPT = Path(_reaper_script.__file__).read_bytes()
_VERSION = hashlib.sha256(_SCRIPT).hexdigest()[:12]
#: The reaper container's name: one per engine and harbor_gym version (``harbor-gym-reaper-<program hash>``).
REAPER_NAME = f"harbor-gym-reaper-{_VERSION}"
#: The reaper's only label: the hash of its program.
REAPER_LABEL = "io.harbor-gym.reaper"
#: The image the reaper runs (any image with ``python3``), resolved through ``image_aliases``.
REAPER_IMAGE = "python:3.12-slim"
#: The run whose lease keeps a container, network or volume alive (the reaper removes it once the lease is stale).
LEASE_LABEL = _reaper_script.LEASE_LABEL
#: The reaper a resource's lease lives in (`REAPER_NAME`); each reaper removes only resources naming it.
REAPED_BY_LABEL = _reaper_script.REAPED_BY_LABEL
_SCRIPT_PATH = "/harbor-gym-reaper.py"
#: How often a renewing process also checks that the reaper runs (and starts or recreates it).
_CHECK_S = 15.0
#: Bound of waiting for the engine to take a release (at interpreter exit).
_RELEASE_WAIT_S = 5.0

_lock = threading.Lock()
_ensured: dict[str, float] = {}  # engine key -> monotonic time of the last successful check
_attach_lock = threading.Lock()


def lease_labels(run_id: str) -> dict[str, str]:
    """The labels binding a container, network or volume to the lease ``run_id`` in this version's reaper."""
    return {LEASE_LABEL: run_id, REAPED_BY_LABEL: REAPER_NAME}


def reaper_socket() -> str:
    """The engine socket's path on the engine host, mounted into the reaper."""
    explicit = os.environ.get("HARBOR_GYM_REAPER_SOCKET")
    if explicit:
        return explicit
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return "/var/run/docker.sock"


def _engine_key(client: "docker.DockerClient") -> str:
    # Every unix:// client has the same base_url: the socket path tells two local engines (Docker, podman) apart.
    adapter = getattr(client.api, "_custom_adapter", None)
    return (str(getattr(client.api, "base_url", "")) + "|" + str(getattr(adapter, "socket_path", "")) + "|"
            + os.environ.get("DOCKER_HOST", ""))


def _tar(files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_reaper(client: "docker.DockerClient", settings: SandboxSettings | None = None, *,
                  force: bool = False) -> str:
    """Make sure this engine's reaper exists, is of this version and runs; returns its container id.

    Cheap when recently checked (once per `_CHECK_S` per engine and process, unless ``force``). Concurrent processes
    race safely: a name conflict means another one created it.

    Raises:
        SandboxUnavailableError: the reaper cannot be created or started (no image with python3, the engine refuses):
            no Docker sandbox may start without it.
    """
    import docker.errors

    key = _engine_key(client)
    with _lock:
        checked = _ensured.get(key)
        if not force and checked is not None and time.monotonic() - checked < _CHECK_S:
            return REAPER_NAME
    api = client.api
    deadline = time.monotonic() + 30
    while True:
        try:
            attrs = _ensure_running(client, settings or SandboxSettings())
            break
        except docker.errors.APIError as exc:
            # 409: another process is creating, starting or removing it right now; 404: removed meanwhile
            if (exc.status_code in (404, 409) or "marked for removal" in str(exc)) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise SandboxUnavailableError(f"the lease reaper ({REAPER_NAME}) cannot run on this engine: "
                                          f"{exc.explanation or exc}", field="backend", retryable=True) from exc
        except SandboxUnavailableError:
            raise
        except Exception as exc:
            from harbor_gym.errors import HarborGymError

            if isinstance(exc, HarborGymError):
                raise SandboxUnavailableError(f"the lease reaper ({REAPER_NAME}) cannot run on this engine: {exc}",
                                              field="backend", retryable=True) from exc
            raise SandboxUnavailableError(f"the lease reaper ({REAPER_NAME}): the engine does not answer: {exc}",
                                          field="backend", retryable=True) from exc
    with _lock:
        first = key not in _ensured
        _ensured[key] = time.monotonic()
    if first:  # once per process and engine: old versions' reapers are rare, their removal is not free
        _remove_idle_old_reapers(api)
    return attrs.get("Id", REAPER_NAME)


def _ensure_running(client: "docker.DockerClient", settings: SandboxSettings) -> dict:
    """Inspect, create if missing, start if not running; returns the inspect (may raise the SDK's errors)."""
    import docker.errors

    api = client.api
    from harbor_gym.sandbox import _podman

    created = False
    try:
        attrs = api.inspect_container(REAPER_NAME)
    except docker.errors.NotFound:
        created = _create(client, settings)
        attrs = api.inspect_container(REAPER_NAME)
    if not _podman.reaper_mount_current(client, attrs):  # podman's socket moved since: a reaper that reaches it
        log.info("lease reaper %s: podman's socket moved; recreating it", REAPER_NAME)
        api.remove_container(REAPER_NAME, force=True)
        created = _create(client, settings)
        attrs = api.inspect_container(REAPER_NAME)
    state = attrs.get("State") or {}
    if state.get("Status") in ("removing", "dead"):  # being removed (by hand, or as an old version): wait, recreate
        raise docker.errors.APIError(f"{REAPER_NAME} is being removed",
                                     response=_Status(409), explanation="being removed")
    if not state.get("Running"):
        try:
            api.start(REAPER_NAME)
        except docker.errors.APIError as exc:
            if exc.status_code in (404, 409):
                raise
            # A reaper that exists but cannot start (podman after its run state was refreshed keeps the runtime's
            # state of the old container id: "container with given ID already exists"): a new one has a new id.
            log.warning("lease reaper %s cannot start (%s); recreating it", REAPER_NAME, exc.explanation or exc)
            api.remove_container(REAPER_NAME, force=True)
            created = _create(client, settings)
            attrs = api.inspect_container(REAPER_NAME)
            api.start(REAPER_NAME)
    if created:
        _check_engine(client)
    return attrs


def _check_engine(client: "docker.DockerClient") -> None:
    """A new reaper's socket must reach the engine it runs on (else it would judge another engine's resources by
    this engine's leases): asked once, through the reaper itself (``--check-engine``; it also checks at each start).

    Raises:
        SandboxUnavailableError: it reaches another engine or none (the reaper is removed), naming the socket.
    """
    api = client.api
    exec_id = api.exec_create(REAPER_NAME, ["python3", _SCRIPT_PATH, "--check-engine"], user="0")["Id"]
    out, err = read_all(api, exec_id)
    seen = (out + err).decode("utf-8", "replace").strip()
    if seen == "ok":
        return
    try:
        api.remove_container(REAPER_NAME, force=True)
    except Exception as exc:
        log.debug("removing a reaper that reaches another engine failed: %s", exc)
    raise SandboxUnavailableError(
        f"the lease reaper on engine {engine_key(client)} mounts {_socket_for(client)} of the engine's host, which "
        f"is not that engine's socket ({seen[-300:]}): name the engine's socket path with EnvConfig.engine_sockets "
        "(or HARBOR_GYM_REAPER_SOCKET)", field="EnvConfig.engine_sockets", retryable=False)


def _socket_for(client: "docker.DockerClient") -> str:
    """The engine socket's path on the engine's host: the one its engine set names, else the client's own unix
    socket (that engine is on this host, whatever ``DOCKER_HOST`` names), else `reaper_socket`."""
    from harbor_gym.sandbox.engines import REAPER_SOCKET_ATTR

    named = getattr(client, REAPER_SOCKET_ATTR, None)
    if named:
        return named
    if os.environ.get("HARBOR_GYM_REAPER_SOCKET"):
        return reaper_socket()
    own = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
    return own or reaper_socket()


class _Status:
    """A minimal response for a synthetic `APIError` (its ``status_code``)."""

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.reason = "being removed"
        self.url = ""


def _remove_idle_old_reapers(api: Any) -> None:
    """Remove reapers of other harbor_gym versions that no resource names any more (never raises)."""
    try:
        for c in api.containers(all=True, filters={"label": REAPER_LABEL}):
            name = (c.get("Names") or [""])[0].lstrip("/")
            if name == REAPER_NAME or not name.startswith("harbor-gym-reaper"):
                continue
            selector = {"label": f"{REAPED_BY_LABEL}={name}"}
            if api.containers(all=True, filters=selector) or api.networks(filters=selector) or \
                    (api.volumes(filters=selector) or {}).get("Volumes"):
                continue
            api.remove_container(c["Id"], force=True)
            log.info("removed the idle lease reaper of another harbor_gym version (%s)", name)
    except Exception as exc:  # best effort: an old idle reaper costs a sleeping process
        log.debug("removing idle old reapers failed: %s", exc)


def _create(client: "docker.DockerClient", settings: SandboxSettings) -> bool:
    """Create the reaper (not started), upload its program and the lease folder. False: another process made it."""
    import docker.errors

    from harbor_gym.sandbox import images
    from harbor_gym.sandbox.base import SandboxSpec

    from harbor_gym.sandbox import _podman

    image = images.ensure_image(client, SandboxSpec(image=REAPER_IMAGE, name_hint="reaper"), settings)
    api = client.api
    binds, environment = _podman.reaper_mount(client) or (
        {_socket_for(client): {"bind": _reaper_script.SOCKET, "mode": "rw"}}, {})
    host_config = api.create_host_config(
        restart_policy={"Name": "unless-stopped"},
        binds=binds,
        network_mode="none",
        init=True,
        mem_limit="128m",
        pids_limit=64,
        log_config={"Type": "json-file", "Config": {"max-size": "1m", "max-file": "2"}},
    )
    try:
        api.create_container(image.id, command=["python3", "-u", _SCRIPT_PATH], entrypoint=[], name=REAPER_NAME,
                             labels={REAPER_LABEL: _VERSION}, user="0", working_dir="/", host_config=host_config,
                             environment={"HARBOR_GYM_REAPER_NAME": REAPER_NAME, **environment})
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # another process made it
            return False
        raise
    try:
        _install(api)
    except BaseException:  # never leave a reaper without its program (it would restart forever)
        try:
            api.remove_container(REAPER_NAME, force=True)
        except Exception as exc:
            log.debug("removing a half-made reaper failed: %s", exc)
        raise
    return True


def _install(api: Any) -> None:
    """Upload the reaper's program and its lease folder into the reaper container (idempotent: also repairs a
    reaper whose creator died between creating and uploading)."""
    api.put_archive(REAPER_NAME, "/", _tar({_SCRIPT_PATH.lstrip("/"): _SCRIPT}, dirs=("leases",)))


def lease_records(client: "docker.DockerClient") -> dict[str, str] | None:
    """The lease files in this engine's reaper (run id -> content: a renewal's Unix time or ``released``), read
    through the engine API; ``None`` when no reaper of this version runs there (nothing can be judged by it)."""
    import docker.errors

    try:
        stream, _stat = client.api.get_archive(REAPER_NAME, "/leases")
    except docker.errors.NotFound:
        return None
    data = io.BytesIO(b"".join(stream))
    found: dict[str, str] = {}
    with tarfile.open(fileobj=data, mode="r:") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            handle = tar.extractfile(member)
            if handle is not None:
                found[member.name.rsplit("/", 1)[-1]] = handle.read(64).decode("ascii", "replace").strip()
    return found


class EngineLease:
    """Renews one `Lease` in one engine's reaper from a daemon thread (see the module docstring).

    Guarantees: after construction the lease file exists in the reaper (or the constructor raised); while the lease
    renews (``lease.is_renewing``) the file is rewritten at the lease's interval, and the reaper is checked every
    `_CHECK_S` (restarted or recreated if it died); after ``lease.pause()`` renewals stop; `release` writes
    ``released``.
    """

    def __init__(self, lease: "Lease", client: "docker.DockerClient", settings: SandboxSettings) -> None:
        self.lease = lease
        self.client = client
        self.settings = settings
        self.engine_key = _engine_key(client)
        self._engine_name = engine_key(client)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        ensure_reaper(client, settings)
        try:
            self._write(b"%.3f\n" % time.time(), strict=True)
        except SandboxUnavailableError:
            raise
        except Exception as exc:
            raise SandboxUnavailableError(f"cannot write the run's lease into the reaper: {exc}", field="backend",
                                          retryable=True) from exc

    def start(self) -> None:
        """Start the renewal thread (no-op while it runs)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._beat, name=f"harbor-gym-engine-lease-{self.lease.run_id}",
                                        daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Make the thread look at the lease's interval and state now."""
        self._wake.set()

    def renew(self) -> None:
        """Rewrite the lease file now; a missing reaper is recreated first (raises nothing). The first failure of a
        run of failures is a warning, the rest are debug lines until a renewal succeeds again (an engine that went
        away for good, a removed remote host, would otherwise log at every beat for the rest of the process)."""
        try:
            ensure_reaper(self.client, self.settings)
            self._write(b"%.3f\n" % time.time(), strict=False)
        except Exception as exc:  # the next beat retries; the reaper grants one TTL of grace to a new lease
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            log.log(level, "lease %s: renewal in engine %s failed (retried at each beat, logged again once it "
                    "succeeds): %s", self.lease.run_id, self._engine_name, exc)
            return
        if self._failing:
            self._failing = False
            log.warning("lease %s: renewal in engine %s succeeds again", self.lease.run_id, self._engine_name)

    def release(self) -> None:
        """Mark the lease released: the reaper removes whatever of the run is left at its next pass. Waits at most
        `_RELEASE_WAIT_S` for a slow engine (it runs at interpreter exit); otherwise the lease expires by itself."""
        self._wake.set()

        def write() -> None:
            try:
                self._write(b"released\n", strict=False)
            except Exception as exc:  # engine gone: the lease expires by itself
                log.debug("lease %s: release in the engine failed: %s", self.lease.run_id, exc)

        thread = threading.Thread(target=write, name=f"harbor-gym-lease-release-{self.lease.run_id}", daemon=True)
        thread.start()
        thread.join(_RELEASE_WAIT_S)

    def _write(self, data: bytes, *, strict: bool) -> None:
        import docker.errors

        payload = _tar({self.lease.run_id: data})
        try:
            self.client.api.put_archive(REAPER_NAME, "/leases", payload)
        except docker.errors.NotFound:
            ensure_reaper(self.client, self.settings, force=True)
            try:
                self.client.api.put_archive(REAPER_NAME, "/leases", payload)
            except docker.errors.NotFound:  # the reaper exists without its lease folder: its creator died half-way
                _install(self.client.api)
                self.client.api.put_archive(REAPER_NAME, "/leases", payload)
        except docker.errors.APIError as exc:
            if strict:
                raise SandboxUnavailableError(f"cannot write the run's lease into the reaper: {exc}",
                                              field="backend", retryable=True) from exc
            raise

    def _beat(self) -> None:
        while True:
            self._wake.wait(self.lease.interval_s)
            self._wake.clear()
            if not self.lease.is_renewing:
                return
            self.renew()


def attach(lease: "Lease", client: "docker.DockerClient", settings: SandboxSettings) -> EngineLease:
    """Bind ``lease`` to this engine's reaper (once per lease and engine): the reaper runs, the lease file is
    written, and a thread renews it while the lease renews. Called before a labelled resource is created.

    Raises:
        SandboxUnavailableError: the reaper cannot run or the lease cannot be written (nothing was created).
    """
    from harbor_gym.sandbox._engine import get_client

    key = _engine_key(client)
    with _attach_lock:
        for remote in lease.remotes:
            if isinstance(remote, EngineLease) and remote.engine_key == key:
                if lease.is_renewing:
                    remote.start()
                return remote
        try:  # renew through the process's long-lived client when it talks to the same engine
            shared = get_client()
            if _engine_key(shared) == key:
                client = shared
        except SandboxUnavailableError:
            pass
        engine_lease = EngineLease(lease, client, settings)
        lease.add_remote(engine_lease)
    return engine_lease


def _after_fork_in_child() -> None:
    global _lock, _attach_lock
    _lock = threading.Lock()
    _attach_lock = threading.Lock()
    _ensured.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
