"""Commands in a local sandbox: `LocalExecMixin`, the ``exec`` of `LocalSandbox`.

Every command starts in ``_launch.py``, a fresh host Python process that joins the sandbox's cgroups and
namespaces, drops to the command's user and to `_CAPS` (Docker's default capability set minus ``mknod``), installs
the seccomp filter of ``_seccomp.py`` (Docker's default profile for those capabilities) and only then executes the
command, so no file of the sandbox is ever opened, mapped or executed with host privileges (SPEC
GYM-10; see that module for why this design). Output comes through pipes read into sinks capped at
``output_cap_bytes`` (``_streams.py``: the host keeps no more than the cap, whatever the command writes); on timeout
the command's whole process group is killed.
"""

from __future__ import annotations

import marshal
import os
import posixpath
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox.base import ExecResult
from harbor_gym.sandbox.local import _rootfs, _seccomp, _streams

if TYPE_CHECKING:
    from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec, SandboxState

__all__ = ["LocalExecMixin"]

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Docker's default capability set minus ``mknod``: root inside a local sandbox gets exactly these (never
#: CAP_SYS_ADMIN). ``mknod`` is left out because no device cgroup guards a local sandbox's ``/dev``: a node made
#: for a host disk would open it (Docker's device cgroup refuses that; here the capability itself is withheld).
_CAPS = (
    "chown", "dac_override", "fsetid", "fowner", "net_raw", "setgid", "setuid", "setfcap", "setpcap",
    "net_bind_service", "sys_chroot", "kill", "audit_write",
)
_CAP_BITS = {
    "chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6, "setuid": 7, "setpcap": 8,
    "net_bind_service": 10, "net_raw": 13, "sys_chroot": 18, "audit_write": 29, "setfcap": 31,
}
#: The capability mask the launcher keeps (bounding, permitted and effective sets of root in the sandbox).
CAP_MASK = sum(1 << _CAP_BITS[c] for c in _CAPS)
_LAUNCH = str(Path(__file__).with_name("_launch.py"))
#: `_raw`'s default bound of what a root command's stdout may write to the host (an archive for ``get``).
RAW_STDOUT_CAP = 1 << 30
#: `_raw`'s exit code when the command's stdout passed its cap (the file holds the first ``stdout_cap`` bytes).
RAW_OVER_CAP_EXIT = 250


class LocalExecMixin:
    """`exec` and the raw root commands that file transfer uses; mixed into `LocalSandbox` (it holds the state)."""

    if TYPE_CHECKING:  # provided by `LocalSandbox`
        name: str
        spec: SandboxSpec
        settings: SandboxSettings
        _state: SandboxState
        _pid: int | None

        @property
        def workdir(self) -> str: ...
        @property
        def default_user(self) -> str: ...
        @property
        def cgroup_dirs(self) -> tuple[str, ...]: ...
        def is_alive(self) -> bool: ...
        def _drainer(self) -> _streams.Drainer: ...

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

    def _request(self, pid: int, command: str | Sequence[str], info: _rootfs.UserInfo, cwd: str,
                 env: Mapping[str, str]) -> dict:
        """The launcher's request for ``command`` as ``info`` in ``cwd`` (``cd`` runs inside, as the user)."""
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", f"cd -- {shlex.quote(cwd)} || exit 126\n{command}"]
        elif cwd == "/":
            argv = list(command)
        else:
            argv = ["/bin/sh", "-c", 'cd -- "$0" || exit 126; exec "$@"', cwd, *command]
        return {
            "pid": pid, "cgroups": [d + "/cgroup.procs" for d in self.cgroup_dirs], "uid": info.uid,
            "gid": info.gid, "groups": list(info.groups), "caps": CAP_MASK, "seccomp": _seccomp.program(_CAPS),
            "argv": argv, "env": dict(env),
        }

    def _launch(self, request: dict, *, stdin: int | None, stdout: int, stderr: int) -> subprocess.Popen:
        """Start the launcher for ``request`` in a new session (its process group is the command's), with the
        given file descriptors as its stdin (``None``: /dev/null), stdout and stderr."""
        fd = os.memfd_create("harbor-gym-launch")  # close-on-exec: only the launcher gets it (pass_fds)
        try:
            os.write(fd, marshal.dumps(request))
            os.lseek(fd, 0, os.SEEK_SET)
            return subprocess.Popen(
                [sys.executable, "-I", "-S", _LAUNCH, str(fd)], pass_fds=(fd,),
                stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=stdout, stderr=stderr,
                env={}, start_new_session=True, close_fds=True,
            )
        finally:
            os.close(fd)

    def _start_command(self, request: dict, *, stdin: bytes | None, stdout: _streams.Sink,
                       stderr: _streams.Sink, timeout: float | None) -> tuple[int | None, bool]:
        """Run ``request`` with its output in pipes read into the sinks (GYM-10: nothing of it lands on the host
        beyond the sinks' caps); returns (the launcher's return code, timed out). On timeout the command's whole
        process group is killed."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (None, None)
        try:
            proc = self._launch(request, stdin=in_r, stdout=out_w, stderr=err_w)
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise SandboxError(f"cannot run a command in local sandbox {self.name}: {exc}", field="exec") from exc
        for fd in (out_w, err_w, in_r):
            if fd is not None:
                os.close(fd)
        timed_out = True
        try:
            timed_out = _streams.collect(proc, {out_r: stdout, err_r: stderr}, stdin_fd=in_w, stdin=stdin,
                                         timeout=timeout, drainer=self._drainer())
        finally:
            if timed_out or proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()
        return proc.returncode, timed_out

    def _run(
        self, command: str | Sequence[str], *, timeout: float | None, user: str | None, env: Mapping[str, str] | None,
        cwd: str | None, stdin: bytes | None,
    ) -> tuple[int, bytes, int, bytes, int, bool, float]:
        """Run a command; returns (exit code, stdout head, stdout size, stderr head, stderr size, timed out, s)."""
        pid = self._require_running()
        t0 = time.monotonic()
        cwd = _abs(cwd or self.workdir)
        self._require_folder(pid, cwd)
        info = _rootfs.resolve_user(f"/proc/{pid}/root", user or self.default_user)
        environ = {"PATH": _DEFAULT_PATH, "HOSTNAME": self.name[:63], "HOME": info.home}
        environ.update(self.spec.env)
        environ.update(env or {})
        request = self._request(pid, command, info, cwd, environ)
        cap = self.settings.output_cap_bytes
        out, err = _streams.Sink(cap), _streams.Sink(cap)
        code, timed_out = self._start_command(request, stdin=stdin, stdout=out, stderr=err, timeout=timeout)
        if not self.is_alive():
            raise SandboxError(f"local sandbox {self.name} stopped while a command ran", field="exec")
        code = 128 - code if code is not None and code < 0 else code
        if timed_out or code is None:
            code = -1
        return code, bytes(out.head), out.size, bytes(err.head), err.size, timed_out, time.monotonic() - t0

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
        self, command: Sequence[str], *, stdin: bytes | None = None, timeout: float = 600.0,
        stdout_cap: int = RAW_STDOUT_CAP,
    ) -> tuple[int, Path, str]:
        """Run ``command`` as root; returns (exit code, its stdout in a temp file the caller removes, the head of
        its stderr). At most ``stdout_cap`` bytes of stdout are written to the host (GYM-10: a sandbox's own
        ``tar``, which a root agent may have replaced, cannot fill the host's disk); past it the command is killed
        and the exit code is `RAW_OVER_CAP_EXIT`."""
        pid = self._require_running()
        root = _rootfs.UserInfo(name="root", uid=0, gid=0, groups=(0,), home="/root")
        request = self._request(pid, command, root, "/", {"PATH": _DEFAULT_PATH, "HOME": "/root"})
        fd, path = tempfile.mkstemp(prefix="harbor-gym-get-")
        try:
            with os.fdopen(fd, "wb") as fh:
                out, err = _streams.Sink(stdout_cap, file=fh, halt_past_cap=True), _streams.Sink(4096)
                code, timed_out = self._start_command(request, stdin=stdin, stdout=out, stderr=err, timeout=timeout)
        except BaseException:
            os.unlink(path)
            raise
        if out.size > stdout_cap:
            code = RAW_OVER_CAP_EXIT
        elif timed_out or code is None:
            code = -1
        return code, Path(path), bytes(err.head).decode(errors="replace").strip()


def _abs(path: str) -> str:
    if not path.startswith("/"):
        raise SandboxPathError("sandbox paths must be absolute", path=path)
    return posixpath.normpath(path)


def _cut(head: bytes, size: int, cap: int) -> tuple[str, bool]:
    text = head.decode("utf-8", errors="replace")
    if size <= cap:
        return text, False
    return text + f"\n[... harbor_gym: output cut at {cap} bytes of {size} ...]\n", True
