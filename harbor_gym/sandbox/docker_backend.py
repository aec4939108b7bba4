"""`DockerSandbox`: the `Sandbox` protocol on a Docker engine, through the Docker SDK (never the docker CLI).

One container per sandbox, started with an init process (a stop takes milliseconds) whose main process only waits;
it carries its run's lease label, and the engine's reaper (`harbor_gym.sandbox._reaper`, outside every sandbox)
removes it once the host stops renewing that lease (SPEC GYM-10): nothing inside the sandbox takes part.
Limits come from the spec (cpus, memory without swap, pids, tmpfs sizes, storage through the storage
driver); a limit the engine cannot enforce exactly (``gpus`` on this CPU-only backend, ``storage_mb`` on an engine
whose storage driver cannot bound size) is refused at start with `SandboxUnavailableError` (SPEC LOAD-24, GYM-10),
never dropped; `storage_exceeded` tells whether the writable size reached its bound. ``network=False`` gives the
container no interface but loopback; ``network=True`` joins the shared, host-filtered public network
(`harbor_gym.sandbox._netfilter`, GYM-10); ``host_service_port`` without a network joins the proxy network, which
reaches only that host port (`harbor_gym.sandbox.host_route`).

Engine requests per call (the ``engine_requests`` counter counts them): start = create + start (+ image inspect,
cached per process; + 1 container inspect for the spoofing guard when the container joins a network); exec = 2 (+1 kill exec on timeout); put/put_bytes = 1 (+2 once per sandbox to read
``/etc/passwd`` and ``/etc/group`` when an owner is given by name); get/read_file = 1; stop = 1.

Modules: this one (lifecycle, ``exec``), `_docker_container` (labels, host config and limits, create),
`_docker_files` (put/get/read_file), `_docker_exec` (the exec wrapper and stream reader).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox import _docker_exec as dx
from harbor_gym.sandbox import _podman
from harbor_gym.sandbox import images, lease as leases
from harbor_gym.sandbox._docker_container import TTL_LABEL, DockerContainerMixin, storage_limit_supported
from harbor_gym.sandbox._docker_files import DockerFilesMixin
from harbor_gym.sandbox._docker_outage import DockerOutageMixin
from harbor_gym.sandbox._engine import get_client, scoped_client, translate_error
from harbor_gym.sandbox.base import (
    ExecResult,
    SandboxSettings,
    SandboxSpec,
    SandboxState,
)

if TYPE_CHECKING:
    import docker

__all__ = ["DockerSandbox", "TTL_LABEL", "storage_limit_supported"]

log = logging.getLogger("harbor_gym.sandbox")

#: Host-side grace after a command's timeout for the kill and the wrapper's report.
KILL_GRACE_S = 10.0
#: Without a timeout, how often a quiet exec checks that its container still lives.
POLL_S = 15.0

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_.-]+")


class DockerSandbox(DockerContainerMixin, DockerFilesMixin, DockerOutageMixin):
    """A `Sandbox` backed by one Docker container.

    Args:
        spec: what to start.
        settings: host settings (pull policy, aliases, lease TTL, output cap).
        client: a Docker SDK client (default: the process's shared one); inject one to count engine requests.
        lease: the lease the container is bound to (default: the process's lease).

    Container creation and limits come from `DockerContainerMixin` (``_docker_container.py``), file transfer
    (`put`, `put_bytes`, `get`, `read_file`) from `DockerFilesMixin` (``_docker_files.py``); this class holds
    the lifecycle and `exec`.

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
        self._client = client if client is not None else scoped_client()  # the episode's engine, if any
        self._lease = lease
        hint = _NAME_BAD.sub("-", spec.name_hint).strip("-._")[:40] or "sandbox"
        self.name = f"hg-{hint}-{secrets.token_hex(3)}"
        self.container_id: str | None = None
        self.run_id: str | None = None
        self.engine_requests = 0
        self._state = SandboxState.CREATED
        self._image: images.ImageInfo | None = None
        self._ids: tuple[str, str] | None = None  # cached /etc/passwd, /etc/group
        self._bindings: list = []  # the spoofing guard's bindings of its ports (GYM-10)
        self._host_service_address: str | None = None
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
        """Resolve or build the image, then create and start the container (the workdir is created by the engine
        unless ``spec.create_workdir`` is false; every exec runs in ``cwd``, else the spec's workdir).

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

    def stop(self) -> None:
        """Remove the container (killing everything in it). Idempotent; never raises for a dead sandbox."""
        import docker.errors

        if self._state is SandboxState.STOPPED:
            return
        self._state = SandboxState.STOPPED
        removed = False  # the container is gone: its ports' spoofing-guard bindings may go too
        try:
            target = self.container_id or self.name
            try:
                self.client.api.remove_container(target, force=True)
                self._count()
                removed = True
            except docker.errors.NotFound:
                self._count()
                removed = True
            except docker.errors.APIError as exc:
                self._count()
                removed = exc.status_code == 409
                if exc.status_code != 409:  # 409: removal already in progress (auto_remove)
                    log.warning("sandbox %s: remove failed: %s (its lease removes it)", self.name, exc)
            except Exception as exc:  # engine gone: the lease removes the container by itself
                log.warning("sandbox %s: remove failed: %s (its lease removes it)", self.name, exc)
        finally:
            if removed:
                self._release_network()
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

    def storage_exceeded(self) -> bool:
        """GYM-10: True iff the container's writable layer is at (or within a small margin of) its storage bound.

        Measured by the engine (the container's ``SizeRw``, one list request of ~0.2 s that walks the writable
        layer), never by anything inside the sandbox, so a sandbox process cannot hide it; meant for a turn that
        already failed. The margin is the larger of 32 MiB and 5 % (filesystem metadata and the last short write
        stay unaccounted). Where the engine cannot size a layer that is over its quota (btrfs simple quotas report
        ``-1``), one root write of 1 MiB decides: it fails with "quota exceeded"/"no space left" (a sandbox
        process could only hide that, making the turn an ordinary outage). False without a storage bound, once
        the container is gone, or if the engine does not answer."""
        limit_mb = self.spec.storage_mb
        if limit_mb is None or self.container_id is None:
            return False
        try:
            listed = self.client.api.containers(all=True, size=True, filters={"id": self.container_id})
        except Exception as exc:  # an engine that does not answer says nothing of the sandbox's storage
            log.debug("sandbox %s: storage size unknown: %s", self.name, exc)
            # podman's size listing fails outright for a btrfs layer over its quota: ask the filesystem instead
            return _podman.is_podman(self.client) and self.is_alive() and self._write_fails_for_space()
        finally:
            self._count()
        if not listed:
            return False
        used = int(listed[0].get("SizeRw") or 0)
        if used < 0:  # the engine could not size the layer: on btrfs simple quotas, because it is over quota
            return self._write_fails_for_space()
        limit = limit_mb << 20
        return used >= limit - max(32 << 20, limit // 20)

    def _write_fails_for_space(self) -> bool:
        probe = "/.hg-storage-probe"
        try:
            res = self.exec(["/bin/sh", "-c", f"dd if=/dev/zero of={probe} bs=1M count=1 2>&1; rc=$?; "
                             f"rm -f {probe}; exit $rc"], timeout=30, user="root", cwd="/")
            text = res.stdout + res.stderr
        except SandboxError as exc:  # the exec wrapper itself could not write its temporary folder
            text = str(exc)
        return any(s in text.lower() for s in ("quota exceeded", "no space left"))

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
                environment=dict(env) if env else None, workdir=cwd or self.spec.workdir,
            )["Id"]
            self._count()
            sock, early = dx.start_attached(api, exec_id)
            self._count()
        except Exception as exc:
            translate_error(exc, what="exec", sandbox=self.name)
        raw_sock = getattr(sock, "_sock", sock)  # kept: closing the SocketIO drops its reference to the socket
        if stdin is not None:
            self._feed(sock, stdin, deadline, exec_id)

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
                                 poll_s=POLL_S, on_poll=on_poll, early=early)
        except SandboxError:
            raise
        except Exception as exc:
            translate_error(exc, what="exec", sandbox=self.name)
        finally:
            _close_socket(sock, raw_sock)
        duration = time.monotonic() - started
        lost = False
        if res.exit_code is None:
            exit_code = self._exit_without_trailer(res, exec_id, cwd)
            lost = not res.timed_out  # GYM-12: something in the sandbox killed the wrapper (kill -9 -1)
        else:
            exit_code = res.exit_code
            if exit_code >= 128 and not self.is_alive():
                # killed by a signal: the whole container may have been killed, the wrapper racing to report
                raise self._died("exec")
        out_text, out_cut = _decode(res.stdout, res.stdout_size, cap)
        err_text, err_cut = _decode(res.stderr, res.stderr_size, cap)
        return ExecResult(exit_code=exit_code, stdout=out_text, stderr=err_text, duration_s=duration,
                          timed_out=res.timed_out, stdout_truncated=out_cut, stderr_truncated=err_cut,
                          wrapper_lost=lost)

    def _feed(self, sock: Any, data: bytes, deadline: float | None, exec_id: str) -> None:
        """Send ``data`` as the command's stdin, within the deadline. A command that stops reading is no error here
        (it ended, was killed, or the deadline passed): the stream then says what happened to it, as the engine saw
        it. While the send is blocked, the engine is asked every half second whether the exec still runs."""
        import socket as _socket

        raw = getattr(sock, "_sock", sock)
        before = raw.gettimeout()
        view, sent = memoryview(data), 0
        try:
            while sent < len(view):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                raw.settimeout(0.5 if left is None else min(0.5, left))
                try:
                    sent += raw.send(view[sent:sent + (1 << 16)])
                except (TimeoutError, _socket.timeout):
                    if not self._exec_running(exec_id):
                        return
            raw.shutdown(_socket.SHUT_WR)
        except OSError as exc:
            log.debug("sandbox %s: the command stopped reading its stdin: %s", self.name, exc)
        finally:
            raw.settimeout(before)

    def _exec_running(self, exec_id: str) -> bool:
        try:
            running = bool(self.client.api.exec_inspect(exec_id).get("Running"))
            self._count()
            return running
        except Exception:  # the stream will tell
            return False

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
            code = self._engine_exit_code(exec_id, wait_s=1.0)
            if code is not None and code >= 128:
                # The engine saw the wrapper killed by a signal before it said its pid, the container alive: a
                # process of the sandbox killed it (GYM-12), a lost wrapper like one killed later, never a retry.
                return code
            # e.g. runc cannot fork inside a cgroup at its pids cap: transient
            raise SandboxError(f"sandbox {self.name}: exec could not start the command: {text.strip()[-500:]}",
                               retryable=True)
        code = self._engine_exit_code(exec_id)
        if code is None:
            raise self._died("exec")
        return code

    def _engine_exit_code(self, exec_id: str, *, wait_s: float = 0.0) -> int | None:
        """The exec's exit code as the engine recorded it (``None``: none yet), asked again for ``wait_s``."""
        give_up = time.monotonic() + wait_s
        while True:
            try:
                code = self.client.api.exec_inspect(exec_id).get("ExitCode")
                self._count()
            except Exception as exc:
                translate_error(exc, what="exec", sandbox=self.name)
            if code is not None or time.monotonic() >= give_up:
                return None if code is None else int(code)
            time.sleep(0.05)



def _decode(data: bytes, total: int, cap: int) -> tuple[str, bool]:
    if total <= cap and len(data) <= cap:
        return data.decode("utf-8", errors="replace"), False
    return data[:cap].decode("utf-8", errors="replace") + dx.cut_marker(cap, max(total, len(data))), True


def _close_socket(sock: Any, raw: Any) -> None:
    """Close an exec's attached socket for good (the SDK leaves that to the caller; best effort).

    ``sock`` is the SDK's file-like wrapper and ``raw`` the socket under it, taken before anything closed the
    wrapper (which forgets its socket). ``socket.close()`` defers while file objects made from the socket are alive,
    and the SDK's dropped HTTP response still holds one, so the descriptor is detached and closed here: no socket
    outlives its exec.
    """
    import socket as _socket

    try:
        sock.close()
        fd = raw.detach() if isinstance(raw, _socket.socket) else -1
        if fd >= 0:
            os.close(fd)
    except OSError:
        pass
