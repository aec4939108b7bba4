"""`LocalSandbox`: the embedded ``local`` backend — bubblewrap over an unpacked root filesystem, no daemon.

Layout of one sandbox (see ``_keeper.py`` for the process that owns it):

- root: an overlayfs of the image's root filesystem folder (read-only, never written) and a writable layer of the
  sandbox's own (a folder under ``$HARBOR_GYM_LOCAL_ROOT`` or ``<tmp>/harbor-gym-local/<name>``, a size-bounded tmpfs
  when ``storage_mb`` is set), mounted only in the keeper's private mount namespace;
- private mount, PID, IPC and UTS namespaces; a private network namespace (loopback only) when the network is off,
  the host's network namespace when it is on; Docker's default capability set;
- ``/proc``, ``/dev``, ``/etc/hosts``, ``/etc/hostname``, the spec's tmpfs mounts, the workdir and ``/logs/{agent,
  verifier,artifacts}``; a fresh read-only ``/sys`` of the sandbox's network namespace (``/sys/class/net`` holds
  only ``lo`` when the network is off) whose ``/sys/fs/cgroup`` shows the sandbox's own cgroups, laid out like
  Docker's, when it has limits (cgroup v1 or v2); a ``storage_mb`` tmpfs layer is charged to the memory limit too;
- a lease (`harbor_gym.sandbox.lease`, the process's unless one is given): the keeper ends the sandbox and removes
  everything of it once the lease file has not been renewed for ``lease_ttl_s`` (the trainer died) or is gone.

Commands enter the namespaces with ``nsenter`` (a few ms per exec) and drop to the user with the sandbox's own
``setpriv`` (supplementary groups, Docker's capability bounding set). A root filesystem without ``setpriv`` falls back
to ``nsenter --setuid/--setgid``: no supplementary groups, and root keeps the host's capabilities there. Files move
with the sandbox's own ``tar`` (``put``/``get``) or are read from the host through the sandbox's root (``read_file``).
Users and owners are resolved from the sandbox's /etc/passwd and /etc/group, never the host's.
What this backend cannot honour is refused at `start` with `SandboxUnavailableError`: a build context, an image with
no root filesystem folder, GPUs, a limit that cgroups cannot enforce here (LOAD-24).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError, SandboxUnavailableError
from harbor_gym.sandbox import archives
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox.base import ExecResult, SandboxSettings, SandboxSpec, SandboxState
from harbor_gym.sandbox.local import _cgroups, _rootfs

__all__ = ["LocalSandbox", "local_root", "local_unavailable_reason"]

_KEEPER = Path(__file__).with_name("_keeper.py")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Docker's default capability set; root inside a local sandbox gets exactly these (never CAP_SYS_ADMIN).
_CAPS = (
    "chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid", "setuid", "setfcap", "setpcap",
    "net_bind_service", "sys_chroot", "kill", "audit_write",
)
_TASK_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
_START_TIMEOUT_S = 30.0
_MISSING_EXIT = 44
_NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"


def local_root() -> Path:
    """Where local sandboxes keep their folders (``$HARBOR_GYM_LOCAL_ROOT``, else ``<tmp>/harbor-gym-local``)."""
    return Path(os.environ.get("HARBOR_GYM_LOCAL_ROOT") or Path(tempfile.gettempdir()) / "harbor-gym-local")


def local_unavailable_reason() -> str | None:
    """None when this host can run local sandboxes (root, bwrap, nsenter, unshare, overlayfs), else why not."""
    if os.geteuid() != 0:
        return "the local backend needs root (overlayfs and namespaces); use docker"
    for tool in ("bwrap", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; run scripts/setup-host.sh"
    try:
        with open("/proc/filesystems") as fh:
            if "overlay" not in fh.read():
                return "the kernel has no overlay filesystem"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    return None


def _slug(text: str) -> str:
    return (re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "sandbox")[:30]


class LocalSandbox:
    """A sandbox on bubblewrap over an unpacked root filesystem (see the module docstring). Implements `Sandbox`.

    Args:
        spec: what to start; ``image`` must map to a root filesystem folder (settings' ``image_aliases`` first, then
            ``rootfs_aliases``).
        settings: host settings (aliases, lease TTL, output cap).
        lease: the lease the sandbox is bound to (default: the process's lease).

    Attributes:
        backend: ``"local"``.
        name: ``hg-<name_hint>-<random>``; also the sandbox's hostname and its folder's name.
        run_id: the id of the lease (run) the sandbox is bound to, once started.
    """

    backend = "local"

    def __init__(
        self, spec: SandboxSpec, settings: SandboxSettings | None = None, *, lease: leases.Lease | None = None
    ) -> None:
        self.spec = spec
        self.settings = settings or SandboxSettings()
        self._lease_obj = lease
        self.run_id: str | None = None
        self.name = f"hg-{_slug(spec.name_hint)}-{secrets.token_hex(4)}"
        self._state = SandboxState.CREATED
        self._dir = local_root() / self.name
        self._keeper: subprocess.Popen | None = None
        self._pid: int | None = None
        self._cgroups = _cgroups.CgroupSet()
        self._setpriv: str | None = None
        self._lock = threading.Lock()

    # --- protocol properties -----------------------------------------------------------------------------
    @property
    def state(self) -> SandboxState:
        return self._state

    @property
    def workdir(self) -> str:
        """The spec's workdir, else ``/`` (a root filesystem folder has no image WORKDIR)."""
        return self.spec.workdir or "/"

    @property
    def default_user(self) -> str:
        """The spec's user, else ``root`` (a root filesystem folder has no image USER)."""
        return self.spec.user or "root"

    @property
    def pid(self) -> int | None:
        """Host pid of the sandbox's PID 1 while it runs (for diagnostics and tests)."""
        return self._pid

    @property
    def folder(self) -> Path:
        """The sandbox's host folder (writable layer, lease); removed at stop."""
        return self._dir

    @property
    def cgroup_dirs(self) -> tuple[str, ...]:
        """The sandbox's cgroup folders on the host (empty without limits)."""
        return self._cgroups.dirs

    # --- lifecycle ---------------------------------------------------------------------------------------
    def resolve_rootfs(self) -> Path:
        """The root filesystem folder for the spec's image.

        Raises:
            SandboxUnavailableError: a build context, or an image with no root filesystem folder here.
        """
        spec = self.spec
        if spec.build_context is not None:
            raise SandboxUnavailableError(
                "the local backend cannot build Dockerfiles; use docker", path=spec.build_context, field="build_context"
            )
        image = spec.image or ""
        local = self.settings.image_aliases.get(image, image)
        folder = self.settings.rootfs_aliases.get(local) or self.settings.rootfs_aliases.get(image)
        if not folder:
            raise SandboxUnavailableError(
                f"the local backend has no root filesystem for image {image!r}"
                + (f" (alias of {local!r})" if local != image else "")
                + "; map it in [rootfs_aliases] of the host settings file or use docker",
                field="image",
            )
        path = Path(folder)
        if not (path / "bin").exists() and not (path / "usr").is_dir():
            raise SandboxUnavailableError(
                f"the root filesystem folder {path} for image {image!r} is missing or empty", path=path, field="image"
            )
        return path

    def _refuse_unsupported(self) -> None:
        spec = self.spec
        if spec.gpus:
            raise SandboxUnavailableError(
                "the local backend cannot give a sandbox GPUs; use docker", field="gpus", rule="LOAD-24"
            )
        reason = local_unavailable_reason()
        if reason:
            raise SandboxUnavailableError(reason)
        for mount, size in spec.tmpfs.items():
            if not mount.startswith("/") or size <= 0:
                raise SandboxUnavailableError(f"bad tmpfs mount {mount!r} of {size} MiB", field="tmpfs")
        if spec.cpus is not None and spec.cpus <= 0:
            raise SandboxUnavailableError(f"cpus must be > 0, got {spec.cpus}", field="cpus", rule="LOAD-24")

    def start(self) -> None:
        """Start the sandbox. After a raise nothing of it is left (processes, mounts, cgroups, folders).

        Raises:
            SandboxUnavailableError: what this backend cannot honour (see the module docstring; LOAD-24 for limits).
            SandboxError: the sandbox failed to come up.
        """
        if self._state is not SandboxState.CREATED:
            raise SandboxError(f"sandbox {self.name} was already started", field="start")
        leases.register(self)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self._state = SandboxState.RUNNING

    def _start(self) -> None:
        spec = self.spec
        rootfs = self.resolve_rootfs()
        self._refuse_unsupported()
        lease = self._lease_obj or leases.process_lease()
        lease.want_ttl(self.settings.lease_ttl_s)
        self.run_id = lease.run_id
        self._dir.mkdir(parents=True, mode=0o700)
        meta = {"name": self.name, "run_id": lease.run_id, "lease": str(lease.path), "ttl": self.settings.lease_ttl_s,
                "labels": dict(spec.labels), "created": time.time(), "cgroups": []}
        (self._dir / "meta.json").write_text(json.dumps(meta))
        self._cgroups = _cgroups.create_cgroups(
            self.name, cpus=spec.cpus, memory_mb=spec.memory_mb, pids_limit=spec.pids_limit
        )
        meta["cgroups"] = list(self._cgroups.dirs)
        (self._dir / "meta.json").write_text(json.dumps(meta))
        hostname = self.name[:63]
        prefix = self._join_cgroups_prefix() + [shutil.which("bwrap") or "bwrap"]
        prefix += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--hostname", hostname]
        prefix += ["--cap-drop", "ALL"]
        for cap in _CAPS:
            prefix += ["--cap-add", f"CAP_{cap.upper()}"]
        args = ["--proc", "/proc", "--dev", "/dev"]
        for mount, size in sorted(spec.tmpfs.items()):
            args += ["--size", str(int(size) * 1024 * 1024), "--tmpfs", mount]
        args += ["--chdir", "/", "--", "/bin/sh", "-c", "exec sleep infinity"]
        files = {
            "/etc/hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n",
            "/etc/hostname": hostname + "\n",
        }
        cfg = {
            "dir": str(self._dir), "lower": str(rootfs), "storage_mb": spec.storage_mb, "lease": str(lease.path),
            "ttl": self.settings.lease_ttl_s, "prefix": prefix, "args": args, "files": files,
            "dirs": sorted({self.workdir, *_TASK_DIRS} - {"/"}), "cgroups": list(self._cgroups.dirs),
            "cgroup_binds": [list(b) for b in self._cgroups.binds], "private_net": not spec.network,
        }
        # The keeper's own mount namespace (the overlay never shows on the host) and, with the network off, a
        # fresh network namespace holding only loopback, shared by bwrap and every exec.
        argv = [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private"]
        if not spec.network:
            argv.append("--net")
        argv += ["--", sys.executable, "-I", "-S", str(_KEEPER), json.dumps(cfg)]
        self._keeper = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        report = self._read_report()
        if "error" in report:
            raise SandboxUnavailableError(f"the local sandbox could not start: {report['error']}", field="start")
        self._pid = int(report["pid"])
        root = f"/proc/{self._pid}/root"
        for candidate in ("/usr/bin/setpriv", "/bin/setpriv"):
            fd = None
            try:
                fd = _rootfs.open_in_root(root, candidate, flags=os.O_PATH)
                self._setpriv = candidate
                break
            except OSError:
                continue
            finally:
                if fd is not None:
                    os.close(fd)

    def _read_report(self) -> dict:
        keeper = self._keeper
        ready, _, _ = select.select([keeper.stdout], [], [], _START_TIMEOUT_S)
        line = keeper.stdout.readline() if ready else b""
        if not line:
            try:
                keeper.kill()
                _, err = keeper.communicate(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                err = b""
            raise SandboxError(
                "the local sandbox's keeper did not report within "
                f"{_START_TIMEOUT_S:.0f}s: {err.decode(errors='replace')[-2000:].strip() or 'no output'}",
                field="start", retryable=True,
            )
        return json.loads(line)

    def _join_cgroups_prefix(self) -> list[str]:
        """A host ``/bin/sh`` prefix that moves itself into the sandbox's cgroups and execs the rest (none w/o)."""
        if not self._cgroups.dirs:
            return []
        script = "".join(f"echo $$ > {shlex.quote(d + '/cgroup.procs')} && " for d in self._cgroups.dirs)
        return ["/bin/sh", "-c", script + 'exec "$@"', "sh"]

    def is_alive(self) -> bool:
        """True iff the sandbox runs (its keeper and PID 1 are up)."""
        return (
            self._state is SandboxState.RUNNING
            and self._keeper is not None
            and self._keeper.poll() is None
            and self._pid is not None
            and os.path.exists(f"/proc/{self._pid}/root")
        )

    def stop(self) -> None:
        """Kill every process of the sandbox and remove its mounts, cgroups and folder. Idempotent, never raises."""
        with self._lock:
            if self._state is SandboxState.STOPPED:
                return
            self._state = SandboxState.STOPPED
        keeper = self._keeper
        if keeper is not None:
            try:
                if keeper.poll() is None:
                    keeper.send_signal(signal.SIGTERM)
                keeper.wait(timeout=15)
            except subprocess.TimeoutExpired:
                keeper.kill()
                keeper.wait(timeout=5)
            except OSError:
                pass
            for stream in (keeper.stdout, keeper.stderr):
                if stream is not None:
                    stream.close()
        _cgroups.remove_cgroups(self._cgroups.dirs)
        shutil.rmtree(self._dir, ignore_errors=True)
        leases.unregister(self)
        self._pid = None

    def __enter__(self) -> "LocalSandbox":
        if self._state is SandboxState.CREATED:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalSandbox(name={self.name!r}, image={self.spec.image!r}, state={self._state.value})"

    # --- commands ----------------------------------------------------------------------------------------
    def _require_running(self) -> int:
        if not self.is_alive():
            raise SandboxError(f"local sandbox {self.name} is not running ({self._state.value})", field="exec")
        return self._pid  # type: ignore[return-value]

    def _require_folder(self, pid: int, path: str) -> None:
        """Raise `SandboxPathError` unless ``path`` is a folder inside the sandbox."""
        try:
            fd = _rootfs.open_in_root(f"/proc/{pid}/root", path, flags=os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            if not self.is_alive():
                raise SandboxError(f"local sandbox {self.name} is not running", field="exec") from exc
            raise SandboxPathError(f"no such folder in local sandbox {self.name}", path=path, field="cwd") from exc
        os.close(fd)

    def _argv(self, pid: int, command: str | Sequence[str], user: str, cwd: str) -> tuple[list[str], _rootfs.UserInfo]:
        info = _rootfs.resolve_user(f"/proc/{pid}/root", user)
        argv = self._join_cgroups_prefix()
        # -w without a path: the sandbox PID 1's cwd ("/"); nsenter would open a given path on the host.
        argv += [_NSENTER, "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w"]
        if self._setpriv is None:
            argv += ["-S", str(info.uid), "-G", str(info.gid), "--"]
        else:
            argv += [
                "--", self._setpriv, f"--reuid={info.uid}", f"--regid={info.gid}",
                f"--groups={','.join(str(g) for g in info.groups)}",
                "--bounding-set=-all," + ",".join("+" + c for c in _CAPS), "--inh-caps=-all", "--",
            ]
        if isinstance(command, str):
            argv += ["/bin/sh", "-c", f"cd -- {shlex.quote(cwd)} || exit 126\n{command}"]
        elif cwd == "/":
            argv += list(command)
        else:
            argv += ["/bin/sh", "-c", 'cd -- "$0" || exit 126; exec "$@"', cwd, *command]
        return argv, info

    def _run(
        self, command: str | Sequence[str], *, timeout: float | None, user: str | None, env: Mapping[str, str] | None,
        cwd: str | None, stdin: bytes | None,
    ) -> tuple[int, bytes, int, bytes, int, bool, float]:
        """Run a command; returns (exit code, stdout head, stdout size, stderr head, stderr size, timed out, s)."""
        pid = self._require_running()
        t0 = time.monotonic()
        cwd = _abs(cwd or self.workdir)
        self._require_folder(pid, cwd)
        argv, info = self._argv(pid, command, user or self.default_user, cwd)
        environ = {"PATH": _DEFAULT_PATH, "HOSTNAME": self.name[:63], "HOME": info.home}
        environ.update(self.spec.env)
        environ.update(env or {})
        cap = self.settings.output_cap_bytes
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=out, stderr=err,
                    env=environ, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                raise SandboxError(f"cannot run a command in local sandbox {self.name}: {exc}", field="exec") from exc
            timed_out = False
            try:
                proc.communicate(input=stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if timed_out or proc.returncode is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    proc.wait()
            if not self.is_alive():
                raise SandboxError(f"local sandbox {self.name} stopped while a command ran", field="exec")
            code = proc.returncode
            code = 128 - code if code < 0 else code
            if timed_out:
                code = -1
            heads = []
            for fh in (out, err):
                size = os.fstat(fh.fileno()).st_size
                fh.seek(0)
                heads.append((fh.read(cap), size))
        return code, heads[0][0], heads[0][1], heads[1][0], heads[1][1], timed_out, time.monotonic() - t0

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
        """Run ``command`` in the sandbox (see `Sandbox.exec`). Returns when the command itself exits; on timeout
        its whole process group is killed (``timed_out``, exit code ``-1``).

        Raises:
            SandboxError: the sandbox is not running, or ``user`` is unknown to the sandbox.
        """
        code, out, out_size, err, err_size, timed_out, took = self._run(
            command, timeout=timeout, user=user, env=env, cwd=cwd, stdin=stdin
        )
        cap = self.settings.output_cap_bytes
        stdout, out_cut = _cut(out, out_size, cap)
        stderr, err_cut = _cut(err, err_size, cap)
        return ExecResult(
            exit_code=code, stdout=stdout, stderr=stderr, duration_s=took, timed_out=timed_out,
            stdout_truncated=out_cut, stderr_truncated=err_cut,
        )

    def _raw(
        self, command: Sequence[str], *, stdin: bytes | None = None, timeout: float = 600.0
    ) -> tuple[int, Path, str]:
        """Run ``command`` as root; returns (exit code, its uncapped stdout in a temp file the caller removes,
        the head of its stderr)."""
        pid = self._require_running()
        argv, _ = self._argv(pid, command, "root", "/")
        fd, path = tempfile.mkstemp(prefix="harbor-gym-get-")
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=fd, stderr=err, env={"PATH": _DEFAULT_PATH, "HOME": "/root"},
                                    start_new_session=True)
            try:
                proc.communicate(input=stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            err.seek(0)
            return proc.returncode, Path(path), err.read(4096).decode(errors="replace").strip()
        finally:
            os.close(fd)
            err.close()

    # --- files -------------------------------------------------------------------------------------------
    def _owner(self, owner: str | None) -> archives.Owner | None:
        if owner is None:
            return None
        root = f"/proc/{self._require_running()}/root"
        passwd = (_rootfs.read_in_root(root, "/etc/passwd", 16 << 20) or b"").decode(errors="replace")
        group = (_rootfs.read_in_root(root, "/etc/group", 16 << 20) or b"").decode(errors="replace")
        resolved = archives.resolve_owner(owner, passwd, group)
        if resolved is None:
            raise SandboxError(f"owner {owner!r} is unknown to local sandbox {self.name}", field="owner")
        return resolved

    def _untar(self, archive: bytes, *, what: str) -> None:
        """Extract an archive rooted at ``/`` inside the sandbox, as root, with the sandbox's own tar."""
        code, out, err = self._raw(["tar", "-x", "--numeric-owner", "-p", "-f", "-", "-C", "/"], stdin=archive)
        out.unlink(missing_ok=True)
        if code != 0:
            raise SandboxError(
                f"copying into local sandbox {self.name} failed (exit {code}): {err}",
                path=what, field="put",
            )

    def put(self, local: Path, dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        """Copy a local file to ``dest`` or a local folder's contents into the folder ``dest`` (see `Sandbox.put`).

        Raises:
            SandboxError: ``local`` is missing, ``owner`` is unknown, or the copy failed.
        """
        dest = _abs(dest)
        archive = archives.tar_local_path(Path(local), dest, owner=self._owner(owner), mode=mode)
        self._untar(archive, what=dest)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        """Write ``data`` as the file ``dest`` (parents created)."""
        dest = _abs(dest)
        self._untar(archives.tar_bytes(data, dest, owner=self._owner(owner), mode=mode), what=dest)

    def get(self, src: str, dest_dir: Path) -> Path:
        """Copy ``src`` into ``dest_dir/<basename>`` (see `Sandbox.get`).

        Raises:
            SandboxPathError: ``src`` does not exist. ArchiveError: a member would escape ``dest_dir``.
        """
        parent, base = _split(_abs(src))
        script = f'cd -- "$1" 2>/dev/null && {{ [ -e "$2" ] || [ -L "$2" ]; }} || exit {_MISSING_EXIT}; ' \
                 'exec tar -c --numeric-owner -f - -- "$2"'
        code, archive, err = self._raw(["/bin/sh", "-c", script, "sh", parent, base])
        try:
            if code == _MISSING_EXIT:
                raise SandboxPathError(f"no such file or folder in local sandbox {self.name}", path=src, field="get")
            if code != 0:
                raise SandboxError(f"reading {src} from local sandbox {self.name} failed (exit {code}): "
                                   f"{err}", path=src, field="get")
            with open(archive, "rb") as fh:
                archives.safe_extract(fh, Path(dest_dir))
        finally:
            archive.unlink(missing_ok=True)
        return Path(dest_dir) / base

    def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` of the regular file ``path`` (``None`` if it is not one), read from the host
        through the sandbox's root without following any link out of it."""
        pid = self._require_running()
        try:
            return _rootfs.read_in_root(f"/proc/{pid}/root", _abs(path), max_bytes)
        except OSError as exc:
            raise SandboxError(f"cannot read {path} in local sandbox {self.name}: {exc}", path=path,
                               field="read_file") from exc


def _abs(path: str) -> str:
    if not path.startswith("/"):
        raise SandboxPathError("sandbox paths must be absolute", path=path)
    return posixpath.normpath(path)


def _split(path: str) -> tuple[str, str]:
    parent, base = posixpath.split(path.rstrip("/") or "/")
    if not base:
        raise SandboxPathError("a file path is needed, not the root folder", path=path)
    return parent or "/", base


def _cut(head: bytes, size: int, cap: int) -> tuple[str, bool]:
    text = head.decode("utf-8", errors="replace")
    if size <= cap:
        return text, False
    return text + f"\n[... harbor_gym: output cut at {cap} bytes of {size} ...]\n", True
