"""GYM-10 on the local (bubblewrap) backend: every process of a local sandbox runs under Docker's default seccomp
profile, so root there (host uid 0 with Docker's capabilities) cannot reach the kernel interfaces Docker keeps from a
container: new user namespaces, keyrings, bpf, perf_event_open, userfaultfd, kexec, modules, io_uring, the mount API.

One probe (python3 ctypes, run inside) tries ~40 syscalls with harmless arguments, each in a forked child, and
reports ``ok`` or the errno. As root in a local sandbox it gets the same answers as in a Docker container of the same
image (the engine's default profile), except `DELIBERATE` differences; without the filter (the negative control: the
same probe launched with an allow-all filter) many of those answers differ, so the checks can fail. Ordinary work
(bash, tar, python3, fork/exec, threads, sockets, su) still runs; PID 1 and launched commands are filtered.
"""

from __future__ import annotations

import json
import platform

import pytest

from harbor_gym import sandbox as sandboxes
from harbor_gym.config import EnvConfig
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.local import LocalSandbox
from harbor_gym.sandbox.local import _exec, _seccomp

from .helpers import BASE_IMAGE, LABEL

pytestmark = [pytest.mark.bwrap,
              pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86_64 syscall numbers")]

#: (name, x86_64 number, arguments): arguments are harmless wherever the call is allowed (NULL pointers, bad fds,
#: queries); a string argument is passed as a C string. ``fork``-like calls ``_exit`` at once in the new process.
PROBES = [
    ("unshare(CLONE_NEWUSER)", 272, [0x10000000]),
    ("unshare(CLONE_NEWNS)", 272, [0x00020000]),
    ("clone(CLONE_NEWUSER)", 56, [0x10000000 | 17, 0, 0, 0, 0]),
    ("clone(SIGCHLD)", 56, [17, 0, 0, 0, 0]),
    ("clone3", 435, [0, 0]),
    ("keyctl(get user keyring)", 250, [0, -4, 0]),
    ("add_key", 248, [0, 0, 0, 0, -2]),
    ("request_key", 249, [0, 0, 0, 0]),
    ("bpf", 321, [0, 0, 0]),
    ("perf_event_open", 298, [0, 0, -1, -1, 0]),
    ("userfaultfd", 323, [0x7FFFFFFF]),
    ("kexec_load", 246, [0, 0, 0, 0]),
    ("kexec_file_load", 320, [-1, -1, 0, 0, 0]),
    ("init_module", 175, [0, 0, 0]),
    ("finit_module", 313, [-1, 0, 0]),
    ("delete_module", 176, [0, 0]),
    ("mount", 165, [0, 0, 0, 0, 0]),
    ("umount2", 166, [0, 0]),
    ("open_tree", 428, [-1, 0, 0]),
    ("fsopen", 430, [0, 0]),
    ("fspick", 433, [-1, 0, 0]),
    ("move_mount", 429, [-1, 0, -1, 0, 0]),
    ("mount_setattr", 442, [-1, 0, 0, 0, 0]),
    ("setns", 308, [-1, 0]),
    ("pivot_root", 155, [0, 0]),
    ("io_uring_setup", 425, [1, 0]),
    ("io_uring_enter", 426, [-1, 0, 0, 0, 0, 0]),
    ("io_uring_register", 427, [-1, 0, 0, 0]),
    ("personality(ADDR_NO_RANDOMIZE)", 135, [0x0040000]),
    ("personality(query)", 135, [0xFFFFFFFF]),
    ("socket(AF_VSOCK)", 41, [40, 1, 0]),
    ("socket(AF_INET)", 41, [2, 1, 0]),
    ("syslog(size)", 103, [10, 0, 0]),
    ("kcmp", 312, ["self", "self", 0, 0, 0]),
    ("pidfd_getfd", 438, [-1, 0, 0]),
    ("process_madvise", 440, [-1, 0, 0, 0, 0]),
    ("get_mempolicy", 239, [0, 0, 0, 0, 0]),
    ("move_pages", 279, [0, 0, 0, 0, 0, 0]),
    ("fanotify_init", 300, [0x200, 0]),
    ("iopl", 172, [0]),
    ("clock_settime", 227, [0, 0]),
    ("swapoff", 168, [0]),
    ("sethostname", 170, [0, 0]),
    ("chroot(/)", 161, [b"/"]),
    ("process_vm_readv", 310, ["self", 0, 0, 0, 0, 0]),
    ("memfd_create", 319, [b"probe", 0]),
]

#: The probe itself, run as ``python3 -c PROBE JSON`` (stdlib only).
PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, nr, args in json.loads(sys.argv[1]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        cargs = [ctypes.c_char_p(a.encode("latin-1")) if isinstance(a, str) and a != "self"
                 else ctypes.c_long(os.getpid() if a == "self" else a) for a in args]
        res = libc.syscall(ctypes.c_long(nr), *cargs)
        if res == 0 and (nr == 56):
            os._exit(0)  # the new process of a fork-like clone
        err = ctypes.get_errno()
        os.write(w, b"ok" if res >= 0 else errno.errorcode.get(err, str(err)).encode())
        os._exit(0)
    os.close(w)
    answer = b""
    while chunk := os.read(r, 64):
        answer += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[name] = answer.decode() or "died"
print(json.dumps(out))
"""

#: Where this filter answers differently from the engine here on purpose: `_seccomp` follows moby's later profile,
#: and Debian's Docker 20.10 predates three of its changes: io_uring taken out (moby #46762, Docker 25), AF_VSOCK
#: sockets denied (20.10 creates one), process_vm_readv/writev allowed like ptrace (20.10 gates them by
#: CAP_SYS_PTRACE). Each maps to the answer this filter must give.
DELIBERATE = {"io_uring_setup": "EPERM", "io_uring_enter": "EPERM", "io_uring_register": "EPERM",
              "socket(AF_VSOCK)": "EPERM", "process_vm_readv": "ok"}
#: Answers that are EPERM under the filter and differ without it on this kernel: the negative control.
MUST_DIFFER_UNFILTERED = {"unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)", "keyctl(get user keyring)", "clone3",
                          "add_key", "bpf", "perf_event_open", "userfaultfd", "open_tree", "mount_setattr", "setns",
                          "personality(ADDR_NO_RANDOMIZE)", "io_uring_setup", "kcmp", "fanotify_init"}


def _probe_args() -> str:
    return json.dumps([[n, nr, [a.decode() if isinstance(a, bytes) else a for a in args]] for n, nr, args in PROBES])


def _run_probe(sb) -> dict[str, str]:
    r = sb.exec(["python3", "-c", PROBE, _probe_args()], timeout=120, user="root")
    assert r.exit_code == 0, r
    return json.loads(r.stdout)


def _status(sb, pid: str) -> dict[str, str]:
    text = sb.exec(["cat", f"/proc/{pid}/status"], timeout=30).stdout
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


@pytest.fixture(scope="module")
def settings() -> SandboxSettings:
    return SandboxSettings.from_config(EnvConfig(labels=dict([LABEL])))


@pytest.fixture(scope="module")
def local_answers(settings):
    """One local sandbox for the module: the probe's answers (filtered, then with an allow-all filter), the status
    of PID 1 and of a launched command, and whether ordinary work ran."""
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        filtered = _run_probe(sb)
        pid1, own = _status(sb, "1"), _status(sb, "self")
        work = sb.exec(
            "set -e; bash -c 'echo bash-ok'; mkdir -p /tmp/t && echo x > /tmp/t/f && tar -cf /tmp/t.tar -C /tmp t"
            " && tar -tf /tmp/t.tar >/dev/null && echo tar-ok; python3 -c '"
            "import os, socket, threading, subprocess\n"
            "t = threading.Thread(target=print, args=(\"thread-ok\",)); t.start(); t.join()\n"
            "print(subprocess.run([\"/bin/echo\", \"exec-ok\"], capture_output=True, text=True).stdout.strip())\n"
            "s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c = socket.create_connection(s.getsockname())"
            "; print(\"socket-ok\")\n"
            "pid = os.fork()\n"
            "os._exit(0) if pid == 0 else print(\"fork-ok\", os.waitpid(pid, 0)[1])'; "
            "su -s /bin/sh nobody -c 'id -u' ",
            timeout=120)
        original = _seccomp.program
        try:  # the negative control: the same launcher, the same probe, an allow-all filter
            _exec._seccomp.program = lambda caps: _seccomp.allow_all_program()
            unfiltered = _run_probe(sb)
            unfiltered_status = _status(sb, "self")
        finally:
            _exec._seccomp.program = original
        assert _run_probe(sb) == filtered  # the real filter is back
    return {"filtered": filtered, "unfiltered": unfiltered, "pid1": pid1, "own": own, "work": work,
            "unfiltered_status": unfiltered_status}


# SPEC: GYM-10
def test_gym_10_local_root_gets_eperm_where_docker_denies(local_answers):
    got = local_answers["filtered"]
    assert set(got) == {n for n, _, _ in PROBES}, got
    denied = {n for n, a in got.items() if a == "EPERM"}
    must_deny = {"unshare(CLONE_NEWUSER)", "unshare(CLONE_NEWNS)", "clone(CLONE_NEWUSER)", "keyctl(get user keyring)",
                 "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
                 "init_module", "finit_module", "delete_module", "mount", "umount2", "open_tree", "fsopen", "fspick",
                 "move_mount", "mount_setattr", "setns", "pivot_root", "io_uring_setup", "io_uring_enter",
                 "io_uring_register", "personality(ADDR_NO_RANDOMIZE)", "socket(AF_VSOCK)", "syslog(size)", "kcmp",
                 "pidfd_getfd", "process_madvise", "get_mempolicy", "move_pages", "fanotify_init", "iopl",
                 "clock_settime", "swapoff", "sethostname"}
    assert must_deny <= denied, {n: got[n] for n in must_deny - denied}
    assert got["clone3"] == "ENOSYS"  # so that libcs fall back to clone
    for allowed in ("clone(SIGCHLD)", "personality(query)", "socket(AF_INET)", "chroot(/)", "process_vm_readv",
                    "memfd_create"):
        assert got[allowed] == "ok", (allowed, got[allowed])


# SPEC: GYM-10
def test_gym_10_without_the_filter_the_probe_answers_differently(local_answers):
    got, bare = local_answers["filtered"], local_answers["unfiltered"]
    assert local_answers["unfiltered_status"]["Seccomp"] == "2"  # an allow-all filter: the check below is real
    differ = {n for n in got if got[n] != bare[n]}
    assert MUST_DIFFER_UNFILTERED <= differ, {n: (got[n], bare[n]) for n in MUST_DIFFER_UNFILTERED - differ}
    assert bare["unshare(CLONE_NEWUSER)"] == "ok"  # the hole the filter closes


# SPEC: GYM-10
def test_gym_10_pid_1_and_launched_commands_are_filtered_and_ordinary_work_runs(local_answers):
    pid1, own = local_answers["pid1"], local_answers["own"]
    assert pid1["Seccomp"] == "2" and pid1["NoNewPrivs"] == "1", pid1  # bwrap --seccomp (it sets no_new_privs)
    # A launched command: filtered, no_new_privs off as in Docker (so set-uid programs such as su work).
    assert own["Seccomp"] == "2" and own["NoNewPrivs"] == "0", own
    work = local_answers["work"]
    assert work.exit_code == 0, work
    for word in ("bash-ok", "tar-ok", "thread-ok", "exec-ok", "socket-ok", "fork-ok 0"):
        assert word in work.stdout, work
    assert work.stdout.strip().splitlines()[-1] == "65534", work  # su to another user


# SPEC: GYM-10
@pytest.mark.docker
def test_gym_10_local_answers_equal_a_docker_containers(local_answers, settings):
    with sandboxes.open(SandboxSpec(image=BASE_IMAGE), backend="docker", settings=settings) as sb:
        docker = _run_probe(sb)
        status = _status(sb, "self")
    assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "0", status  # what the local backend mirrors
    local = local_answers["filtered"]
    differ = {n: (local[n], docker[n]) for n in local if local[n] != docker[n]}
    assert set(differ) <= set(DELIBERATE), differ
    for name, answer in DELIBERATE.items():
        assert local[name] == answer, (name, local[name], docker[name])
