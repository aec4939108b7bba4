"""The seccomp filter of every process in a local sandbox: Docker's default profile, compiled host-side with libseccomp.

SPEC GYM-10. Root in a local sandbox is host uid 0 with Docker's default capabilities minus ``mknod``; without a
syscall filter it would reach kernel interfaces that Docker's default profile keeps from a container (keyrings,
unprivileged user namespaces, bpf, perf_event_open, userfaultfd, io_uring, the new mount API, ...). This module
builds, once per process, the BPF program that bubblewrap (``--seccomp FD``: the sandbox's PID 1 and all it forks)
and the launcher (``_launch.py``: every command, right before its ``execve``) install.

What it follows: moby's default profile (``profiles/seccomp/default_linux.go`` of moby/moby, as of Docker 25+):

- default action ``EPERM`` for every syscall not allowed below;
- the base allow list, minus ``io_uring_setup``/``io_uring_enter``/``io_uring_register`` (moby #46762, Docker 25),
  plus the syscalls of kernels 6.5–6.7 moby added later (``cachestat``, ``fchmodat2``, ``map_shadow_stack``,
  ``futex_wait``/``futex_wake``/``futex_requeue``);
- ``ptrace``, ``process_vm_readv``/``writev`` (kernel >= 4.8, whose seccomp re-checks a tracee's syscalls);
- ``socket`` for every family but ``AF_VSOCK``; ``personality`` only for the five personas moby allows;
- ``arch_prctl`` and ``modify_ldt`` on x86_64, the ``arm_*``/``cacheflush``/``set_tls`` calls on aarch64;
- the rules moby grants per capability, only for the capabilities the sandbox keeps (`_BY_CAPABILITY`): with
  Docker's default set that is ``chroot`` alone (``CAP_SYS_CHROOT``); without ``CAP_SYS_ADMIN``, ``clone`` only
  without namespace flags (``CLONE_NEWNS|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWCGROUP``) and ``clone3`` answered
  ``ENOSYS``, so that libcs fall back to ``clone`` (whose flags a filter can see);
- the same rules for every ABI the host's kernel runs: x86_64, x86 (``int 0x80``) and x32 on an x86_64 host,
  aarch64 and arm on an aarch64 host. Another architecture has no filter, so its local backend is refused.

Where it differs from Docker: a syscall this libseccomp cannot name is left out (denied, ``EPERM``); runc answers
``ENOSYS`` for syscalls newer than the profile, this filter ``EPERM`` (only ``clone3`` gets ``ENOSYS``). The x86
ABI reaches ``socket`` also through ``socketcall``, whose arguments no filter sees (as in Docker). Debian bookworm's
Docker 20.10 predates three changes this filter follows: it still allows io_uring and ``AF_VSOCK`` sockets, and
gates ``process_vm_readv``/``writev`` by ``CAP_SYS_PTRACE`` (``tests/hostile/test_local_seccomp.py`` compares both).

It imports nothing of harbor_gym beyond errors; libseccomp (``libseccomp.so.2``, Debian's ``libseccomp2``) is
loaded through ctypes on first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import threading
from collections.abc import Iterable

from harbor_gym.errors import SandboxUnavailableError

__all__ = ["allow_all_program", "program", "unavailable_reason"]

#: moby's base allow list (see the module docstring for what was taken out and added).
_ALLOW = """
accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep clock_nanosleep_time64
close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old
epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat
faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat
fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs
fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait futex_waitv futex_wake futimesat
getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32
getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid
getresuid32 getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday
getuid getuid32 getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy
io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill
landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen
listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise map_shadow_stack membarrier
memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect
mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink
mremap msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat _newselect
open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll
ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev
pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages
removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask
rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo
sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam
sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64 send sendfile
sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32
setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32 setxattr shmat shmctl
shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall socketpair splice stat stat64
statfs statfs64 statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create
timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask
uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()
#: Allowed since kernel 4.8, whose seccomp re-checks every syscall a tracer changes.
_PTRACE = ("process_vm_readv", "process_vm_writev", "ptrace")
#: Allowed by host architecture (moby's ``includes.arches``: the host's, applied to all its ABIs).
_BY_ARCH = {
    "x86_64": ("arch_prctl", "modify_ldt"),
    "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls"),
}
#: The ABIs of each host architecture (moby's ``archMap``), libseccomp's names; the first is the native one.
_ABIS = {"x86_64": ("x86_64", "x86", "x32"), "aarch64": ("aarch64", "arm")}
#: Allowed only with a capability (moby's ``includes.caps``), by capability name as `_exec._CAPS` spells them.
_BY_CAPABILITY = {
    "dac_read_search": ("open_by_handle_at",),
    "sys_admin": ("bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
                  "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open", "quotactl",
                  "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog", "umount", "umount2", "unshare"),
    "sys_boot": ("reboot",),
    "sys_chroot": ("chroot",),
    "sys_module": ("delete_module", "init_module", "finit_module"),
    "sys_pacct": ("acct",),
    "sys_ptrace": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"),
    "sys_rawio": ("iopl", "ioperm"),
    "sys_time": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "sys_tty_config": ("vhangup",),
    "sys_nice": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "syslog": ("syslog",),
    "bpf": ("bpf",),
    "perfmon": ("perf_event_open",),
}
#: ``personality`` values moby allows: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query 0xffffffff.
_PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
_AF_VSOCK = 40
_CLONE_NAMESPACES = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000
_EPERM, _ENOSYS = 1, 38

# libseccomp's constants (seccomp.h).
_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_ATTR_ACT_BADARCH, _ATTR_CTL_NNP, _ATTR_CTL_OPTIMIZE = 2, 3, 8
_CMP_NE, _CMP_EQ, _CMP_MASKED_EQ = 1, 4, 7


def _act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    """``struct scmp_arg_cmp``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _libseccomp() -> ctypes.CDLL:
    """libseccomp with the prototypes used here. Raises OSError where it cannot be loaded."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise OSError(-rc, f"libseccomp: {what}: {os.strerror(-rc)}")


class _Filter:
    """One libseccomp filter context being built (released by `export`)."""

    def __init__(self, lib: ctypes.CDLL, machine: str, default_action: int) -> None:
        self._lib = lib
        self._ctx = lib.seccomp_init(default_action)
        if not self._ctx:
            raise OSError("libseccomp: seccomp_init failed")
        try:
            # Only export is used (never seccomp_load), so libseccomp's no_new_privs switch stays off: the
            # launcher decides about no_new_privs itself.
            _check(lib.seccomp_attr_set(self._ctx, _ATTR_CTL_NNP, 0), "no_new_privs attribute")
            _check(lib.seccomp_attr_set(self._ctx, _ATTR_ACT_BADARCH, _ACT_KILL_PROCESS), "bad-arch action")
            lib.seccomp_attr_set(self._ctx, _ATTR_CTL_OPTIMIZE, 2)  # a binary tree of syscalls; best effort
            for abi in _ABIS[machine][1:]:
                token = lib.seccomp_arch_resolve_name(abi.encode())
                if token == 0:
                    raise OSError(f"libseccomp does not know the {abi} ABI")
                rc = lib.seccomp_arch_add(self._ctx, token)
                if rc != -17:  # EEXIST: already there
                    _check(rc, f"add the {abi} ABI")
        except BaseException:
            lib.seccomp_release(self._ctx)
            raise

    def add(self, action: int, name: str, *conditions: tuple[int, int, int, int]) -> bool:
        """Add ``action`` for syscall ``name`` (with ``(arg, op, a, b)`` conditions, all of which must hold) to every
        ABI that has it; False when libseccomp cannot name it (then it stays at the default action)."""
        nr = self._lib.seccomp_syscall_resolve_name(name.encode())
        if nr == -1:  # __NR_SCMP_ERROR
            return False
        cmps = (_ArgCmp * max(1, len(conditions)))(*[_ArgCmp(*c) for c in conditions])
        _check(self._lib.seccomp_rule_add_array(self._ctx, action, nr, len(conditions), cmps), f"rule for {name}")
        return True

    def export(self) -> bytes:
        """The BPF program (``struct sock_filter[]``, native byte order); releases the context."""
        fd = os.memfd_create("harbor-gym-seccomp")
        try:
            _check(self._lib.seccomp_export_bpf(self._ctx, fd), "export")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
            self._lib.seccomp_release(self._ctx)


def _machine() -> str:
    machine = platform.machine()
    if machine not in _ABIS:
        raise OSError(f"no seccomp profile for {machine} hosts (only {', '.join(_ABIS)})")
    return machine


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = [int(p) for p in os.uname().release.split("-")[0].split(".")[:2]]
    except ValueError:
        return False
    return tuple(parts) >= (major, minor)


def _build(caps: frozenset[str]) -> bytes:
    lib = _libseccomp()
    machine = _machine()
    flt = _Filter(lib, machine, _act_errno(_EPERM))
    names = set(_ALLOW) | set(_BY_ARCH.get(machine, ()))
    if _kernel_at_least(4, 8):
        names |= set(_PTRACE)
    for cap in caps:
        names |= set(_BY_CAPABILITY.get(cap, ()))
    for name in sorted(names):
        flt.add(_ACT_ALLOW, name)
    if "sys_admin" not in caps:
        flt.add(_ACT_ALLOW, "clone", (0, _CMP_MASKED_EQ, _CLONE_NAMESPACES, 0))
        flt.add(_act_errno(_ENOSYS), "clone3")
    flt.add(_ACT_ALLOW, "socket", (0, _CMP_NE, _AF_VSOCK, 0))
    for persona in _PERSONAS:
        flt.add(_ACT_ALLOW, "personality", (0, _CMP_EQ, persona, 0))
    return flt.export()


def program(caps: Iterable[str]) -> bytes:
    """The filter for a sandbox that keeps capabilities ``caps`` (lower-case names without ``CAP_``, as
    `_exec._CAPS`), built once per process and cached: a BPF program to hand to ``bwrap --seccomp`` or to
    ``prctl(PR_SET_SECCOMP)`` (a non-empty multiple of 8 bytes).

    Raises:
        SandboxUnavailableError: libseccomp is missing or cannot build the filter here (GYM-10: a local sandbox
            never runs unfiltered).
    """
    key = frozenset(caps)
    with _lock:
        try:
            return _cached(key)
        except OSError as exc:
            raise SandboxUnavailableError(
                f"the local backend cannot build its seccomp filter ({exc}); install libseccomp2 (run "
                "scripts/setup-host.sh) or use docker", field="backend", rule="GYM-10") from exc


@functools.lru_cache(maxsize=4)
def _cached(caps: frozenset[str]) -> bytes:
    data = _build(caps)
    if not data or len(data) % 8:
        raise OSError(f"libseccomp exported a program of {len(data)} bytes")
    return data


@functools.lru_cache(maxsize=1)
def allow_all_program() -> bytes:
    """A filter of the same ABIs that allows everything: the baseline of the cost benchmark and of the tests'
    negative controls; never used by the backend itself.

    Raises:
        OSError: libseccomp is missing or cannot build it.
    """
    return _Filter(_libseccomp(), _machine(), _ACT_ALLOW).export()


def unavailable_reason(caps: Iterable[str]) -> str | None:
    """None when `program` can build the filter for ``caps`` here, else why not (for `local_unavailable_reason`)."""
    try:
        program(caps)
    except SandboxUnavailableError as exc:
        return str(exc)
    return None
