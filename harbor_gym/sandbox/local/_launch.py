"""The launcher of one command in a local sandbox: a standalone host script (run as ``python3 -I -S _launch.py FD``).

SPEC GYM-10: no file of a sandbox is ever opened, mapped or executed with host privileges. Every command of a local
sandbox (an ``exec``, and the root ``tar`` of file transfer) starts here, and this script is the whole privileged
part of it:

1. read its request (``marshal``: the sandbox's pid, the cgroups to join, uid, gid, groups, the capabilities to keep,
   the seccomp filter, argv, env) from the file descriptor ``FD`` (a memfd the host wrote; env never passes through
   this process's own environment, so ``LD_PRELOAD`` and friends of a task never reach a host binary). A request
   without a seccomp filter (a BPF program, ``_seccomp.py``) is refused before anything else happens;
2. join the sandbox's cgroups (host paths) and open the sandbox's namespace files and root (host ``/proc``);
3. ``setns`` into its IPC, UTS, network, PID and mount namespaces, then ``chroot`` to its root. From here on this
   process runs as host root inside the sandbox's mount namespace, so it touches no path at all: every module and
   every libc symbol it uses was loaded before step 3, it imports nothing and prints no traceback (which would
   read source files) — errors go out as a fixed message with ``os.write`` and ``os._exit``;
4. fork (joining the PID namespace takes effect for children only; both processes are non-dumpable, so no process
   of the sandbox can ptrace the child or open its ``/proc`` files before its ``execve``); the child, still touching
   no path, joins a fresh session keyring (not the trainer's), drops the capability bounding set to the sandbox's
   set (Docker's default set minus ``mknod``), clears the ambient set, installs the seccomp filter (Docker's default
   profile), sets the supplementary groups, gid and uid, clears the inheritable set, restores the default signal
   dispositions, and only then ``execve``s the command (searching ``PATH`` like ``execvp``). So the kernel opens the
   sandbox's binary, its ``ld.so``, its libc and its ``/etc/ld.so.preload`` with the command's own credentials and
   under the filter: root inside the sandbox is bounded like Docker's root, any other user has no capability at all.
   The filter goes in while the child still holds ``CAP_SYS_ADMIN``, as runc installs it when no_new_privs is off
   (Docker's default): so no_new_privs stays off and set-uid programs of the sandbox (``su``, ``sudo``) work as in a
   Docker container; every call after it (``setgroups``, ``setres[ug]id``, ``capset``, ``rt_sigaction``,
   ``rt_sigprocmask``, ``execve``) is one the filter allows, and a refused one ends the child, never unfiltered;
5. the parent waits and exits with the child's status (``128 + signal`` when killed by a signal).

Why this and not the other ways (brief of issue 12, item 2). (a) An exec server inside the sandbox would be a
process that a root agent can kill or ptrace, and it would need a trusted binary inside an image that may hold none;
(c) a user namespace changes file ownership semantics (root-owned files, ``chown``) that tasks rely on. A fresh
single-threaded host process that drops everything before the first ``execve`` keeps Docker's semantics exactly,
costs ~10 ms, and has no moving part inside the sandbox. The host starts it with ``subprocess`` (fork + exec of the
host's own Python, safe in a multithreaded trainer), never by forking the trainer's interpreter.

It imports nothing of harbor_gym, and only builtin modules besides ``ctypes``.
"""

import ctypes
import marshal
import os
import signal
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_setns = _libc.setns
_prctl = _libc.prctl
_capset = _libc.capset
_capget = _libc.capget
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CAP_VERSION_3 = 0x20080522
#: keyctl(2) by machine, and KEYCTL_JOIN_SESSION_KEYRING: the command gets a fresh, empty session keyring instead
#: of the trainer's (root in the sandbox is host uid 0 and could read or change the trainer's session keys).
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
_KEYCTL_JOIN_SESSION_KEYRING = 1
_syscall = _libc.syscall
_CAP_LAST = 63
#: setns(2) flags, in the order the namespaces are joined (mount last: the root fd is used right after it).
_NAMESPACES = (("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000), ("pid", 0x20000000),
               ("mnt", 0x00020000))
_SIG_DEFAULTS = tuple(s for s in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None), signal.SIGINT,
                                  signal.SIGQUIT, signal.SIGTERM) if s is not None)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    """``struct sock_fprog``: the filter handed to ``prctl(PR_SET_SECCOMP)``."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_header = _CapHeader(_CAP_VERSION_3, 0)
_data = (_CapData * 2)()
_errno = ctypes.get_errno
_strerror = os.strerror


def _die(code, what, err):
    os.write(2, b"harbor_gym: " + what + b": " + _strerror(err).encode() + b"\n")
    os._exit(code)


def _drop(uid, gid, groups, keep_caps, fprog):
    """In the child: session keyring, bounding set, ambient, seccomp filter, groups, gid, uid, inheritable; touches
    no path."""
    if _SYS_KEYCTL is not None and _syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        _die(126, b"cannot leave the session keyring", _errno())
    for cap in range(_CAP_LAST + 1):
        if not (keep_caps >> cap) & 1:
            if _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and _errno() != 22:  # EINVAL: no such cap here
                _die(126, b"cannot drop a capability", _errno())
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        _die(126, b"cannot install the seccomp filter", _errno())
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # a non-zero uid loses every permitted/effective capability here
    if _capget(ctypes.byref(_header), _data) != 0:
        _die(126, b"capget", _errno())
    for i in range(2):
        keep = (keep_caps >> (32 * i)) & 0xFFFFFFFF
        _data[i].inheritable = 0
        _data[i].permitted &= keep
        _data[i].effective &= keep
    if _capset(ctypes.byref(_header), _data) != 0:
        _die(126, b"capset", _errno())
    for sig in _SIG_DEFAULTS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _execvpe(argv, env):
    """``execvp`` semantics (PATH search of the command's env) without touching anything but the candidates."""
    name = argv[0]
    if b"/" in name:
        candidates = [name]
    else:
        path = env.get(b"PATH", b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        candidates = [(d or b".") + b"/" + name for d in path.split(b":")]
    last = 2
    for candidate in candidates:
        try:
            os.execve(candidate, argv, env)
        except OSError as exc:
            if last != 13:  # EACCES sticks, as in execvp
                last = exc.errno or 2
    _die(127 if last == 2 else 126, b"cannot run " + name, last)


def main():
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as fh:
        req = marshal.loads(fh.read())
    bpf = req.get("seccomp") if isinstance(req, dict) else None
    if not isinstance(bpf, bytes) or not bpf or len(bpf) % 8 or len(bpf) // 8 > 4096:  # BPF_MAXINSNS
        # GYM-10: never a command without the sandbox's syscall filter.
        os.write(2, b"harbor_gym: refused: the launch request carries no seccomp filter\n")
        os._exit(125)
    filter_buf = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _SockFprog(len(bpf) // 8, ctypes.addressof(filter_buf))
    pid = req["pid"]
    for procs in req["cgroups"]:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    ns_fds = [(os.open("/proc/%d/ns/%s" % (pid, name), os.O_RDONLY), flag) for name, flag in _NAMESPACES]
    root_fd = os.open("/proc/%d/root" % pid, os.O_RDONLY | os.O_DIRECTORY)
    # Not dumpable until the command's own execve resets it: no process of the sandbox (root there has no
    # CAP_SYS_PTRACE) can ptrace this one or open its /proc files (exe: the host's python; fds) in the moments
    # between fork and execve.
    if _prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        _die(125, b"prctl(PR_SET_DUMPABLE)", _errno())
    uid, gid, groups, keep = req["uid"], req["gid"], list(req["groups"]), req["caps"]
    argv = [a.encode() if isinstance(a, str) else a for a in req["argv"]]
    env = {k.encode(): v.encode() for k, v in req["env"].items()}
    # --- from here on: inside the sandbox's namespaces; no path is opened, nothing imported, nothing printed ---
    try:
        for nfd, flag in ns_fds:
            if _setns(nfd, flag) != 0:
                _die(125, b"setns", _errno())
            os.close(nfd)
        os.fchdir(root_fd)
        os.chroot(".")
        os.close(root_fd)
        child = os.fork()
        if child == 0:
            try:
                _drop(uid, gid, groups, keep, fprog)
                _execvpe(argv, env)
            except BaseException as exc:  # noqa: BLE001 - never a traceback (it would read files)
                _die(126, b"cannot start the command (" + type(exc).__name__.encode() + b")",
                     getattr(exc, "errno", None) or 1)
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):
            os._exit(128 + os.WTERMSIG(status))
        os._exit(os.WEXITSTATUS(status))
    except BaseException as exc:  # noqa: BLE001
        _die(125, b"cannot enter the sandbox", getattr(exc, "errno", None) or 1)


if __name__ == "__main__":
    main()
