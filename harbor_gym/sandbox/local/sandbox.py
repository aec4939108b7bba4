"""`LocalSandbox`: the embedded ``local`` backend — bubblewrap over an unpacked root filesystem, no daemon.

Layout of one sandbox (see ``_keeper.py`` for the process that owns it):

- root: an overlayfs of the image's root filesystem folder (read-only, never written) and a writable layer of the
  sandbox's own, mounted only in the keeper's private mount namespace. With ``storage_mb`` (the episode layer fills
  in `EnvConfig.default_storage_mb`, 10240) the layer is a loop-mounted ext4 image of exactly that size in the
  sandbox's folder (``$HARBOR_GYM_LOCAL_ROOT``, else ``<tmp>/harbor-gym-local/<name>``): a writer gets ENOSPC at
  the bound (``dd`` and ``fallocate`` alike), the host disk grows by at most the bound, host memory not at all, and
  `storage_exceeded` tells the engine (GYM-10). Only where no loop device can be had is it a tmpfs of that size
  (charged to host memory and to the sandbox's memory limit). Keep ``$HARBOR_GYM_LOCAL_ROOT`` on a disk, not a
  tmpfs. Without ``storage_mb`` the layer is a plain folder there (unbounded);
- private mount, PID, IPC, UTS and network namespaces, always: with the network off the network namespace holds
  only ``lo``; with it on, ``eth0`` on a host bridge whose firewall lets the sandbox reach neither a host address
  nor a sibling (``_net.py``). Where that filter cannot be installed a public network is refused at start unless
  `SandboxSettings.unfiltered_network` is ``"allow"``, which shares the host's network namespace (GYM-10); a spec
  with ``host_service_port`` gets ``eth0`` on that bridge even without a network, reaching only that port of the
  host (`harbor_gym.sandbox.host_route`), and is refused where no route is open or the filter cannot be installed;
- memory (``memory_mb``, the episode layer's default 4096), pids and cpus through cgroups (``_cgroups.py``);
- ``/proc``, ``/dev``, ``/etc/hosts``, ``/etc/hostname``, the spec's tmpfs mounts, the workdir (unless the spec's
  ``create_workdir`` is false) and ``/logs/{agent,verifier,artifacts}``; a fresh read-only ``/sys`` of the
  sandbox's network namespace whose ``/sys/fs/cgroup`` shows the sandbox's own cgroups, laid out like Docker's,
  when it has limits (cgroup v1 or v2);
- a lease (`harbor_gym.sandbox.lease`, the process's unless one is given): the keeper ends the sandbox and removes
  everything of it once the lease file has not been renewed for ``lease_ttl_s`` (the trainer died) or is gone.

Commands (``_exec.py``) start in a fresh host launcher (``_launch.py``, ~15 ms per exec) that joins the sandbox's
namespaces and cgroups, a fresh session keyring, drops to the command's user and to Docker's default capability
set minus ``mknod`` and installs the seccomp filter before its first ``execve``: no file of the sandbox (its ``sh``, libc, ``ld.so``,
``/etc/ld.so.preload``) is ever opened, mapped or run with host privileges (GYM-10). Their output comes through
pipes into capped buffers (``_streams.py``), never host files. Root in a local sandbox is host uid 0 with Docker's
capabilities; as in Docker, /proc/sys and its kin are read-only and host-wide /proc entries and /sys/firmware are
masked. Every process of the sandbox runs under Docker's default seccomp profile for those capabilities
(``_seccomp.py``; bubblewrap installs it in PID 1, the launcher in every command): keyrings, user namespaces, bpf,
perf_event_open, userfaultfd, io_uring and the mount API fail with EPERM, as under moby's current default profile;
without libseccomp the backend is refused. Files move with the sandbox's own ``tar`` run that way
(``put``/``get``) or are read from the host beneath the sandbox's root (``read_file``, ``copy_out``). Users and
owners are resolved from the sandbox's /etc/passwd and /etc/group, never the host's.
What this backend cannot honour is refused at `start` with `SandboxUnavailableError`: a build context, an image with
no root filesystem folder, GPUs, a limit that cgroups cannot enforce here (LOAD-24), an unfilterable public network
or no libseccomp (GYM-10).
"""

from __future__ import annotations

import json
import logging
import os
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

from harbor_gym.errors import SandboxError, SandboxUnavailableError
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec, SandboxState
from harbor_gym.sandbox.local import _cgroups, _net, _seccomp, _streams
from harbor_gym.sandbox.local._exec import _CAPS, LocalExecMixin
from harbor_gym.sandbox.local._files import LocalFilesMixin

__all__ = ["LocalSandbox", "local_root", "local_unavailable_reason"]

_KEEPER = Path(__file__).with_name("_keeper.py")
_TASK_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
_START_TIMEOUT_S = 30.0
_log = logging.getLogger("harbor_gym.sandbox.local")


def local_root() -> Path:
    """Where local sandboxes keep their folders (``$HARBOR_GYM_LOCAL_ROOT``, else ``<tmp>/harbor-gym-local``)."""
    return Path(os.environ.get("HARBOR_GYM_LOCAL_ROOT") or Path(tempfile.gettempdir()) / "harbor-gym-local")


def local_unavailable_reason() -> str | None:
    """None when this host can run local sandboxes (root, bwrap, nsenter, unshare, overlayfs, a seccomp filter
    built with libseccomp), else why not."""
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
    return _seccomp.unavailable_reason(_CAPS)  # GYM-10: never a local sandbox without its syscall filter


#: Read-only in /proc, as Docker keeps them: the kernel's global settings. Root in a local sandbox is uid 0 of the
#: host's user namespace, so a writable /proc/sys would let it set e.g. kernel.core_pattern, a program the host's
#: kernel then runs as host root (GYM-10).
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "fs", "irq", "bus")
#: Masked in /proc, as Docker masks them (host-wide information): /dev/null over files, an empty tmpfs over folders.
_PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "timer_stats", "acpi", "scsi")


def _proc_guard_args() -> list[str]:
    """bwrap arguments (after ``--proc /proc``) that make `_PROC_READ_ONLY` read-only and mask `_PROC_MASKED`.
    Only what this kernel has (bwrap cannot create entries in procfs). /proc/sys is the host's procfs view bound
    read-only: its entries are global or resolve to the reader's own namespaces (net, ipc, uts), as in Docker."""
    args: list[str] = []
    for name in _PROC_READ_ONLY:
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name in _PROC_MASKED:
        path = f"/proc/{name}"
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _slug(text: str) -> str:
    return (re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "sandbox")[:30]


class LocalSandbox(LocalExecMixin, LocalFilesMixin):
    """A sandbox on bubblewrap over an unpacked root filesystem (see the module docstring). Implements `Sandbox`.

    Args:
        spec: what to start; ``image`` must map to a root filesystem folder (settings' ``image_aliases`` first, then
            ``rootfs_aliases``).
        settings: host settings (aliases, lease TTL, output cap).
        lease: the lease the sandbox is bound to (default: the process's lease).

    Commands (`exec`) come from `LocalExecMixin` (``_exec.py``), file transfer (`put`, `put_bytes`, `get`,
    `read_file`) from `LocalFilesMixin` (``_files.py``); this class starts, watches and stops the sandbox.

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
        self._lock = threading.Lock()
        self._layer: str | None = None
        self._address: str | None = None
        self._host_network = False
        self._drain: _streams.Drainer | None = None

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
    def host_service_address(self) -> str | None:
        """``"IP:PORT"`` of the spec's ``host_service_port`` inside the sandbox (the bridge's address), once
        started; ``None`` when the spec names no port."""
        if self.spec.host_service_port is None or self._address is None:
            return None
        return f"{_net.gateway()}:{self.spec.host_service_port}"

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
        self._host_network = self._refuse_unfiltered_network()
        self._refuse_unrouted()
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
        args = ["--proc", "/proc", *_proc_guard_args(), "--dev", "/dev"]
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
            "dirs": sorted((({self.workdir} if spec.create_workdir else set()) | set(_TASK_DIRS)) - {"/"}),
            "cgroups": list(self._cgroups.dirs),
            "cgroup_binds": [list(b) for b in self._cgroups.binds], "private_net": not self._host_network,
            "seccomp": _seccomp.program(_CAPS).hex(),
        }
        # The keeper's own mount namespace (the overlay never shows on the host) and a fresh network namespace
        # holding only loopback (GYM-10; a public network adds eth0 on the filtered bridge below), shared by bwrap
        # and every exec.
        argv = [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private"]
        if not self._host_network:
            argv.append("--net")
        argv += ["--", sys.executable, "-I", "-S", str(_KEEPER), json.dumps(cfg)]
        self._keeper = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        report = self._read_report()
        if "error" in report:
            raise SandboxUnavailableError(f"the local sandbox could not start: {report['error']}", field="start")
        self._pid = int(report["pid"])
        self._layer = report.get("layer")
        if (spec.network or spec.host_service_port is not None) and not self._host_network:
            self._address = str(_net.attach(self._pid, self._dir, routed_only=not spec.network))

    def _refuse_unfiltered_network(self) -> bool:
        """GYM-10: whether the sandbox must share the host's network namespace (a public network where the host
        filter cannot be installed and ``unfiltered_network == "allow"``); False otherwise.

        Raises:
            SandboxUnavailableError: a public network, no filter here, and ``unfiltered_network == "refuse"``.
        """
        if not self.spec.network:
            return False
        reason = _net.filter_unavailable_reason()
        if reason is None:
            return False
        if self.settings.unfiltered_network != "allow":
            raise SandboxUnavailableError(
                f"the task's network is public but the local backend cannot filter it from the host here ({reason}),"
                " so its sandbox would reach every host service on 127.0.0.1 and every sibling sandbox; run as root"
                " with ip/iptables, use network_mode = 'no-network', or accept it with "
                "EnvConfig(unfiltered_network='allow')", field="network", rule="GYM-10")
        _log.warning("local sandbox %s: public network unfiltered (%s); it shares the host's network namespace "
                     "and reaches every host service and sibling", self.name, reason)
        return True

    def _refuse_unrouted(self) -> None:
        """GYM-10: a spec naming a host service port needs the filter and an open route to that port (never
        unfiltered: the route is the only host port it may reach).

        Raises:
            SandboxUnavailableError: the filter cannot be installed here, or no route to the port is open.
        """
        port = self.spec.host_service_port
        if port is None:
            return
        from harbor_gym.sandbox import host_route

        if self._host_network:
            raise SandboxUnavailableError(
                f"sandbox {self.name}: host_service_port={port} needs the local backend's network filter, which "
                f"cannot be installed here ({_net.filter_unavailable_reason()})", field="host_service_port",
                rule="GYM-10")
        host_route.require_route("local", port, _net.BRIDGE, sandbox=self.name)

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

    def _drainer(self) -> _streams.Drainer:
        """The sandbox's drainer of pipes that left-behind processes still write into (made on first use)."""
        with self._lock:
            if self._drain is None:
                self._drain = _streams.Drainer(self.name)
            return self._drain

    def storage_exceeded(self) -> bool:
        """True iff the sandbox's writable layer is bounded (``storage_mb``) and full now: less than
        min(4 MiB, 2 % of the bound) is left, as its own filesystem counts it (GYM-10, GYM-12). False when unbounded
        or no longer running. A read of the host's statfs of the sandbox's root; nothing inside can spoof it."""
        size_mb = self.spec.storage_mb
        pid = self._pid
        if size_mb is None or pid is None:
            return False
        try:
            st = os.statvfs(f"/proc/{pid}/root")  # overlayfs reports its upper layer: the bounded filesystem
        except OSError:
            return False
        free = st.f_bavail * st.f_frsize
        return free < min(4 << 20, size_mb * (1 << 20) // 50)

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
        with self._lock:
            drain, self._drain = self._drain, None
        if drain is not None:
            drain.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        _net.release(self._address)
        self._address = None
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
