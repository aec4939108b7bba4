"""`DockerSandbox`: the `Sandbox` protocol on a Docker engine, through the Docker SDK (never the docker CLI).

One container per sandbox, started with an init process (a stop takes milliseconds) whose main process is the lease
loop (`harbor_gym.sandbox.lease`): it exits, and the auto-removed container disappears, when the host stops renewing
its lease. Limits come from the spec (cpus, memory without swap, pids, tmpfs sizes); a limit the engine cannot
enforce exactly (``gpus`` on this CPU-only backend, ``storage_mb`` off overlay2-on-xfs) is refused at start with
`SandboxUnavailableError` (SPEC LOAD-24), never dropped. ``network=False`` gives the container no interface but
loopback.

Engine requests per call (the ``engine_requests`` counter counts them): start = create + start (+ image inspect,
cached per process); exec = 2 (+1 kill exec on timeout); put/put_bytes = 1 (+2 once per sandbox to read
``/etc/passwd`` and ``/etc/group`` when an owner is given by name); get/read_file = 1; stop = 1.
"""

from __future__ import annotations

import logging
import re
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError, SandboxUnavailableError
from harbor_gym.sandbox import _docker_exec as dx
from harbor_gym.sandbox import archives, images, lease as leases
from harbor_gym.sandbox._engine import engine_info, get_client, translate_error
from harbor_gym.sandbox.base import (
    MANAGED_LABEL,
    RUN_LABEL,
    ExecResult,
    SandboxSettings,
    SandboxSpec,
    SandboxState,
)

if TYPE_CHECKING:
    import docker

__all__ = ["DockerSandbox", "TTL_LABEL", "storage_limit_supported"]

log = logging.getLogger("harbor_gym.sandbox")

#: The lease TTL (seconds) a container was started with; ``harbor-gym gc`` judges its run's lease by it.
TTL_LABEL = "io.harbor-gym.lease-ttl"

#: Host-side grace after a command's timeout for the kill and the wrapper's report.
KILL_GRACE_S = 10.0
#: Without a timeout, how often a quiet exec checks that its container still lives.
POLL_S = 15.0

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]+")


def storage_limit_supported(info: Mapping[str, Any]) -> bool:
    """True iff the engine can enforce a per-container storage size (overlay2 on xfs; devicemapper; btrfs; zfs).

    overlay2 on xfs additionally needs the ``pquota`` mount option, which the engine reports only when a
    container is created; such a refusal is turned into `SandboxUnavailableError` then."""
    driver = str(info.get("Driver", ""))
    status = {str(k): str(v) for k, v in (info.get("DriverStatus") or [])}
    if driver == "overlay2":
        return status.get("Backing Filesystem", "").lower() == "xfs"
    return driver in ("devicemapper", "btrfs", "zfs", "windowsfilter")


class DockerSandbox:
    """A `Sandbox` backed by one Docker container.

    Args:
        spec: what to start.
        settings: host settings (pull policy, aliases, lease TTL, output cap).
        client: a Docker SDK client (default: the process's shared one); inject one to count engine requests.
        lease: the lease the container is bound to (default: the process's lease).

    Attributes:
        backend: ``"docker"``.
        name: the container's name, ``hg-<name_hint>-<random>``.
        container_id: the container's id once started (else ``None``).
        run_id: the id of the lease (run) the container is bound to.
        engine_requests: how many engine API requests this sandbox has made.
    """

    backend = "docker"

    def __init__(
        self,
        spec: SandboxSpec,
        settings: SandboxSettings | None = None,
        *,
        client: "docker.DockerClient | None" = None,
        lease: leases.Lease | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings or SandboxSettings()
        self._client = client
        self._lease = lease
        hint = _NAME_BAD.sub("-", spec.name_hint).strip("-._")[:40] or "sandbox"
        self.name = f"hg-{hint}-{secrets.token_hex(3)}"
        self.container_id: str | None = None
        self.run_id: str | None = None
        self.engine_requests = 0
        self._state = SandboxState.CREATED
        self._image: images.ImageInfo | None = None
        self._ids: tuple[str, str] | None = None  # cached /etc/passwd, /etc/group
        self._lock = threading.Lock()

    # --- properties -------------------------------------------------------------------------------------
    @property
    def state(self) -> SandboxState:
        return self._state

    @property
    def workdir(self) -> str:
        """The spec's workdir, else the image's WORKDIR, else ``/`` (known after start)."""
        if self.spec.workdir:
            return self.spec.workdir
        return self._image.workdir if self._image else "/"

    @property
    def default_user(self) -> str:
        """The spec's user, else the image's configured user, else ``"root"`` (known after start)."""
        if self.spec.user:
            return self.spec.user
        return self._image.user if self._image else "root"

    def __repr__(self) -> str:
        return f"DockerSandbox(name={self.name!r}, state={self._state.value})"

    @property
    def client(self) -> "docker.DockerClient":
        if self._client is None:
            self._client = get_client()
        return self._client

    def _count(self, n: int = 1) -> None:
        with self._lock:
            self.engine_requests += n

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Resolve or build the image, then create and start the container (workdir created by the engine).

        Raises:
            SandboxUnavailableError: a limit the engine cannot enforce (LOAD-24), or no engine.
            ImageError: the image cannot be found or built.
            SandboxError: the engine refused the container.
        After a raise (KeyboardInterrupt included) nothing of the sandbox is left.
        """
        if self._state is not SandboxState.CREATED:
            raise SandboxError(f"sandbox {self.name} was already started (state {self._state.value})")
        self._refuse_unenforceable()
        leases.register(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _refuse_unenforceable(self) -> None:
        spec = self.spec
        if spec.gpus:
            raise SandboxUnavailableError(
                f"sandbox {self.name}: gpus={spec.gpus} requested but the docker backend here is CPU-only",
                field="gpus", rule="LOAD-24")
        if spec.storage_mb is not None:
            if not storage_limit_supported(engine_info(self.client)):
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb={spec.storage_mb} cannot be enforced by this engine's storage "
                    "driver (needs overlay2 on xfs with pquota, btrfs, zfs or devicemapper)",
                    field="storage_mb", rule="LOAD-24")

    def _start(self) -> None:
        import docker.errors

        spec = self.spec
        lease = self._lease or leases.process_lease()
        lease.want_ttl(self.settings.lease_ttl_s)
        self.run_id = lease.run_id
        self._image = images.ensure_image(self.client, spec, self.settings)
        labels = {**dict(self.settings.labels), **dict(spec.labels),
                  MANAGED_LABEL: "true", RUN_LABEL: lease.run_id, TTL_LABEL: f"{self.settings.lease_ttl_s:g}"}
        api = self.client.api
        host_config: dict[str, Any] = {
            "init": True,
            "auto_remove": True,
            "network_mode": "bridge" if spec.network else "none",
            "binds": {str(lease.path): {"bind": leases.LEASE_MOUNT, "mode": "ro"}},
        }
        if spec.cpus is not None:
            host_config["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.memory_mb is not None:
            host_config["mem_limit"] = f"{spec.memory_mb}m"
            host_config["memswap_limit"] = f"{spec.memory_mb}m"
        if spec.pids_limit is not None:
            host_config["pids_limit"] = spec.pids_limit
        if spec.storage_mb is not None:
            host_config["storage_opt"] = {"size": f"{spec.storage_mb}M"}
        if spec.tmpfs:
            host_config["tmpfs"] = {path: f"size={mb}m" for path, mb in spec.tmpfs.items()}
        try:
            created = self._create(api, labels, host_config)
            self.container_id = created["Id"]
            api.start(self.container_id)
            self._count()
        except docker.errors.APIError as exc:
            text = str(getattr(exc, "explanation", "") or exc)
            if spec.storage_mb is not None and ("storage-opt" in text or "quota" in text):
                raise SandboxUnavailableError(
                    f"sandbox {self.name}: storage_mb cannot be enforced here: {text}", field="storage_mb",
                    rule="LOAD-24") from exc
            translate_error(exc, what="create and start the container", sandbox=self.name)
        except Exception as exc:
            translate_error(exc, what="create and start the container", sandbox=self.name)
        self._state = SandboxState.RUNNING
        log.debug("sandbox %s started (container %s, image %s)", self.name, self.container_id, self._image.ref)

    def _create(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        """Create the container; an image removed since it was inspected (gc) is resolved once more."""
        import docker.errors

        try:
            return self._create_once(api, labels, host_config)
        except docker.errors.ImageNotFound:
            images.forget(self.client, self._image.ref)
            self._image = images.ensure_image(self.client, self.spec, self.settings)
            return self._create_once(api, labels, host_config)

    def _create_once(self, api: Any, labels: dict[str, str], host_config: dict[str, Any]) -> dict:
        spec = self.spec
        self._count()
        return api.create_container(
            self._image.id,
            command=leases.lease_command(self.settings.lease_ttl_s),
            entrypoint=[],
            name=self.name,
            hostname=self.name[:63],
            labels=labels,
            environment=dict(spec.env),
            working_dir=spec.workdir,
            user=spec.user,
            host_config=api.create_host_config(**host_config),
        )

    def stop(self) -> None:
        """Remove the container (killing everything in it). Idempotent; never raises for a dead sandbox."""
        import docker.errors

        if self._state is SandboxState.STOPPED:
            return
        self._state = SandboxState.STOPPED
        try:
            target = self.container_id or self.name
            try:
                self.client.api.remove_container(target, force=True)
                self._count()
            except docker.errors.NotFound:
                self._count()
            except docker.errors.APIError as exc:
                self._count()
                if exc.status_code != 409:  # 409: removal already in progress (auto_remove)
                    log.warning("sandbox %s: remove failed: %s (its lease removes it)", self.name, exc)
            except Exception as exc:  # engine gone: the lease removes the container by itself
                log.warning("sandbox %s: remove failed: %s (its lease removes it)", self.name, exc)
        finally:
            leases.unregister(self)

    def __enter__(self) -> "DockerSandbox":
        if self._state is SandboxState.CREATED:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def is_alive(self) -> bool:
        """True iff the container is running (one inspect)."""
        import docker.errors

        if self._state is not SandboxState.RUNNING or self.container_id is None:
            return False
        try:
            attrs = self.client.api.inspect_container(self.container_id)
        except docker.errors.DockerException:
            return False
        except Exception:
            return False
        finally:
            self._count()
        return bool(attrs.get("State", {}).get("Running"))

    def _require_running(self) -> str:
        if self._state is not SandboxState.RUNNING or self.container_id is None:
            raise SandboxError(f"sandbox {self.name} is not running (state {self._state.value})")
        return self.container_id

    def _confirm_dead(self, window_s: float) -> bool:
        """True if the container is, or within ``window_s`` turns out to be, not running (the engine updates a
        killed container's state a moment after its processes are gone)."""
        deadline = time.monotonic() + window_s
        while True:
            if not self.is_alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def _died(self, what: str) -> SandboxError:
        return SandboxError(f"sandbox {self.name} died or was removed during {what}", retryable=True)

    # --- exec ---------------------------------------------------------------------------------------------
    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` (``str`` through ``/bin/sh -c``, a sequence as argv); see the module `_docker_exec`.

        Returns as soon as the command ends even if it left background processes. On timeout the command's whole
        process group is killed and ``timed_out`` is set (``exit_code`` is the wrapper's report, else -1).

        Raises:
            SandboxError: the sandbox is gone or died during the command (naming it); never for a non-zero exit.
            SandboxPathError: ``cwd`` does not exist.
        """
        cid = self._require_running()
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]
        if not argv:
            raise SandboxError("empty command", field="command")
        cap = self.settings.output_cap_bytes
        api = self.client.api
        started = time.monotonic()
        deadline = None if timeout is None else started + max(0.0, timeout)
        try:
            exec_id = api.exec_create(
                cid, dx.wrap(argv, cap), stdout=True, stderr=True, stdin=stdin is not None, user=user or "",
                environment=dict(env) if env else None, workdir=cwd,
            )["Id"]
            self._count()
            sock = api.exec_start(exec_id, socket=True)
            self._count()
        except Exception as exc:
            translate_error(exc, what="exec", sandbox=self.name)
        if stdin is not None:
            self._feed(sock, stdin)

        def on_deadline(pid: int | None) -> None:
            if pid is not None:
                try:
                    dx.kill_command(api, cid, pid)
                    self._count(2)
                except Exception as exc:  # the container may be gone; the stream tells
                    log.debug("sandbox %s: timeout kill failed: %s", self.name, exc)

        def on_poll() -> None:
            if not self.is_alive():
                raise self._died("exec")

        try:
            res = dx.read_stream(sock, deadline=deadline, on_deadline=on_deadline, grace_s=KILL_GRACE_S,
                                 poll_s=POLL_S, on_poll=on_poll)
        except SandboxError:
            raise
        except Exception as exc:
            translate_error(exc, what="exec", sandbox=self.name)
        duration = time.monotonic() - started
        if res.exit_code is None:
            exit_code = self._exit_without_trailer(res, exec_id, cwd)
        else:
            exit_code = res.exit_code
            if exit_code >= 128 and not self.is_alive():
                # killed by a signal: the whole container may have been killed, the wrapper racing to report
                raise self._died("exec")
        out_text, out_cut = _decode(res.stdout, res.stdout_size, cap)
        err_text, err_cut = _decode(res.stderr, res.stderr_size, cap)
        return ExecResult(exit_code=exit_code, stdout=out_text, stderr=err_text, duration_s=duration,
                          timed_out=res.timed_out, stdout_truncated=out_cut, stderr_truncated=err_cut)

    def _feed(self, sock: Any, data: bytes) -> None:
        import socket as _socket

        raw = getattr(sock, "_sock", sock)
        try:
            raw.sendall(data)
            raw.shutdown(_socket.SHUT_WR)
        except OSError as exc:
            raise SandboxError(f"sandbox {self.name}: could not send stdin: {exc}", retryable=True) from exc

    def _exit_without_trailer(self, res: dx.StreamResult, exec_id: str, cwd: str | None) -> int:
        """The exit code when the wrapper did not report one: the container died, or the exec never started."""
        text = res.stderr.decode("utf-8", "replace") + res.stdout.decode("utf-8", "replace")
        if "chdir to cwd" in text:
            raise SandboxPathError(f"sandbox {self.name}: exec: the working folder does not exist",
                                   path=cwd or self.workdir, field="cwd")
        if self._confirm_dead(2.0):
            raise self._died("exec")
        if res.timed_out:
            return -1
        if res.pid is None:
            # e.g. runc cannot fork inside a cgroup at its pids cap: transient
            raise SandboxError(f"sandbox {self.name}: exec could not start the command: {text.strip()[-500:]}",
                               retryable=True)
        try:
            code = self.client.api.exec_inspect(exec_id).get("ExitCode")
            self._count()
        except Exception as exc:
            translate_error(exc, what="exec", sandbox=self.name)
        if code is None:
            raise self._died("exec")
        return int(code)

    # --- files --------------------------------------------------------------------------------------------
    def _owner(self, owner: str | None) -> archives.Owner | None:
        if owner is None:
            return None
        user, group = archives.parse_owner(owner)
        if user.isdigit() and (group is None or group.isdigit()) and group is not None:
            return archives.Owner(int(user), int(group))
        for attempt in range(2):
            if self._ids is None or attempt == 1:
                passwd = self.read_file("/etc/passwd", max_bytes=1 << 22) or b""
                grp = self.read_file("/etc/group", max_bytes=1 << 22) or b""
                self._ids = (passwd.decode("utf-8", "replace"), grp.decode("utf-8", "replace"))
            found = archives.resolve_owner(owner, *self._ids)
            if found is not None:
                return found
        raise SandboxError(f"sandbox {self.name}: owner {owner!r} is not a user (and group) of the sandbox",
                           field="owner")

    def _put_archive(self, data: bytes, dest: str) -> None:
        cid = self._require_running()
        try:
            self.client.api.put_archive(cid, "/", data)
            self._count()
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"put {dest}", sandbox=self.name)

    def put(self, local: Path, dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        """Place the local file at ``dest`` or the local folder's contents into the folder ``dest`` (one archive;
        owner and mode in its headers; missing parents created root-owned, existing ones untouched)."""
        self._require_running()
        data = archives.tar_local_path(Path(local), dest, owner=self._owner(owner), mode=mode)
        self._put_archive(data, dest)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        """Write ``data`` as the file ``dest`` (parents created)."""
        self._require_running()
        self._put_archive(archives.tar_bytes(data, dest, owner=self._owner(owner), mode=mode), dest)

    def get(self, src: str, dest_dir: Path) -> Path:
        """Copy ``src`` into ``dest_dir/<basename>``; escaping members are refused (`ArchiveError`) before
        anything is written.

        Raises:
            SandboxPathError: ``src`` does not exist.
        """
        cid = self._require_running()
        try:
            stream, _stat = self.client.api.get_archive(cid, src, chunk_size=1 << 20)
            self._count()
            with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
                for chunk in stream:
                    spool.write(chunk)
                spool.seek(0)
                tops = archives.safe_extract(spool, Path(dest_dir))
        except (SandboxError, archives.ArchiveError):
            raise
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"get {src}", sandbox=self.name, path=src)
        name = tops[0] if tops else src.rstrip("/").rsplit("/", 1)[-1]
        return Path(dest_dir) / name

    def read_file(self, path: str, *, max_bytes: int, _hops: int = 0) -> bytes | None:
        """The first ``max_bytes`` bytes of the regular file ``path`` (a symlink is followed); ``None`` if it is
        missing or not a regular file. One engine request; reads only as much of the archive as needed."""
        import docker.errors

        cid = self._require_running()
        try:
            stream, stat = self.client.api.get_archive(cid, path, chunk_size=1 << 16)
        except docker.errors.NotFound as exc:
            self._count()
            if "no such container" in str(getattr(exc, "explanation", "") or exc).lower():
                translate_error(exc, what=f"read {path}", sandbox=self.name)
            return None
        except Exception as exc:
            self._count()
            translate_error(exc, what=f"read {path}", sandbox=self.name, path=path)
        self._count()
        mode = int(stat.get("mode", 0))
        link = stat.get("linkTarget") or ""
        if mode & (1 << 27) and link and _hops < 8:
            stream.close() if hasattr(stream, "close") else None
            return self.read_file(link, max_bytes=max_bytes, _hops=_hops + 1)
        if mode & (1 << 31) or mode & (1 << 27) or mode & ((1 << 26) | (1 << 25) | (1 << 24) | (1 << 21)):
            stream.close() if hasattr(stream, "close") else None
            return None  # a folder, link, device, pipe or socket (Go's os.FileMode bits)
        size = int(stat.get("size", 0))
        want = 512 + min(size, max_bytes)
        buf = bytearray()
        try:
            for chunk in stream:
                buf += chunk
                if len(buf) >= want:
                    break
        except Exception as exc:
            translate_error(exc, what=f"read {path}", sandbox=self.name, path=path)
        finally:
            if hasattr(stream, "close"):
                stream.close()
        return _first_member_data(bytes(buf), max_bytes)


def _first_member_data(buf: bytes, max_bytes: int) -> bytes | None:
    """The data of the first member of a (possibly truncated) tar stream, up to ``max_bytes``."""
    import tarfile

    offset = 0
    # skip PAX / GNU long-name headers
    for _ in range(4):
        if len(buf) < offset + 512:
            return None
        header = buf[offset:offset + 512]
        kind = header[156:157]
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        if kind in (b"x", b"g", b"L", b"K"):
            offset += 512 + ((size + 511) // 512) * 512
            continue
        if kind not in (b"0", b"\0", b"7"):
            return None
        try:
            tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return None
        return buf[offset + 512: offset + 512 + min(size, max_bytes)]
    return None


def _decode(data: bytes, total: int, cap: int) -> tuple[str, bool]:
    if total <= cap and len(data) <= cap:
        return data.decode("utf-8", errors="replace"), False
    return data[:cap].decode("utf-8", errors="replace") + dx.cut_marker(cap, max(total, len(data))), True
