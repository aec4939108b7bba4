"""The local backend's seccomp filter (`_seccomp`) and its refusals, without a sandbox (SPEC GYM-10).

The filter is installed in a fresh host child process (no_new_privs set, as any process may) and tried on each ABI
of an x86_64 kernel: native, x86 (``int 0x80``) and x32 (the x32 bit in the syscall number). The same calls under an
allow-all filter answer differently, so these checks can fail.
"""

from __future__ import annotations

import json
import marshal
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from harbor_gym.sandbox.local import _exec, _seccomp
from harbor_gym.sandbox.local import sandbox as local_sandbox

CAPS = _exec._CAPS
LAUNCH = Path(_exec.__file__).with_name("_launch.py")
KEEPER = Path(_exec.__file__).with_name("_keeper.py")

#: Installs the filter given as hex in argv[1] (after no_new_privs), then makes each call of argv[2] (JSON list of
#: [name, abi, nr, args]) and prints {name: "ok" | errno name}. ABI "x86" goes through int 0x80, "x32" and "native"
#: through the syscall instruction (x32 numbers carry 0x40000000), from a few bytes of machine code.
_SCRIPT = r"""
import ctypes, errno, json, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class F(ctypes.Structure): _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
code = {  # (nr, a, b, c) in rdi, rsi, rdx, rcx
    "x86": bytes.fromhex("53" "89f8" "89f3" "87d1" "cd80" "5b" "c3"),  # push rbx; eax,ebx,ecx<->edx; int 0x80
    "x32": bytes.fromhex("4889f8" "4889f7" "4889d6" "4889ca" "0f05" "c3"),  # rax,rdi,rsi,rdx; syscall
}
mem = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
fns = {}
for i, (abi, body) in enumerate(code.items()):
    mem[i * 64:i * 64 + len(body)] = body
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mem, i * 64))
    rtype = ctypes.c_int if abi == "x86" else ctypes.c_long
    fns[abi] = ctypes.CFUNCTYPE(rtype, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)(addr)
bpf = bytes.fromhex(sys.argv[1])
buf = ctypes.create_string_buffer(bpf, len(bpf))
prog = F(len(bpf) // 8, ctypes.addressof(buf))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, filter
out = {}
for name, abi, nr, args in json.loads(sys.argv[2]):
    args = (args + [0, 0, 0])[:3]
    pid = os.fork()
    if pid == 0:
        if abi == "native":
            res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
            err = ctypes.get_errno() if res < 0 else 0
        else:
            res = fns[abi](nr | (0x40000000 if abi == "x32" else 0), *args)
            err = -res if res < 0 else 0
        os._exit(0 if err == 0 else min(err, 250))
    _, status = os.waitpid(pid, 0)
    code_ = os.waitstatus_to_exitcode(status)
    out[name] = "ok" if code_ == 0 else ("signal" if code_ < 0 else errno.errorcode.get(code_, str(code_)))
print(json.dumps(out))
"""

#: name, ABI, number on that ABI, arguments.
_CALLS = [
    ["getpid", "native", 39, []],
    ["unshare(NEWUSER)", "native", 272, [0x10000000]],
    ["keyctl", "native", 250, [0, -4, 0]],
    ["clone3", "native", 435, [0, 0]],
    ["x86 getpid", "x86", 20, []],
    ["x86 unshare(NEWUSER)", "x86", 310, [0x10000000]],
    ["x86 keyctl", "x86", 288, [0, -4, 0]],
    ["x86 clone3", "x86", 435, [0, 0]],
    ["x32 getpid", "x32", 39, []],
    ["x32 unshare(NEWUSER)", "x32", 272, [0x10000000]],
    ["x32 keyctl", "x32", 250, [0, -4, 0]],
]


def _answers(program: bytes) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", _SCRIPT, program.hex(), json.dumps(_CALLS)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# SPEC: GYM-10
def test_gym_10_the_filter_builds_once_into_a_bpf_program():
    data = _seccomp.program(CAPS)
    assert data and len(data) % 8 == 0 and len(data) // 8 <= 4096  # struct sock_filter[], within BPF_MAXINSNS
    assert _seccomp.program(list(CAPS)) is data  # built once per process, cached
    assert data != _seccomp.allow_all_program()
    assert _seccomp.unavailable_reason(CAPS) is None


# SPEC: GYM-10
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 ABIs")
def test_gym_10_every_abi_gets_the_same_rules():
    got = _answers(_seccomp.program(CAPS))
    bare = _answers(_seccomp.allow_all_program())
    if bare["x86 getpid"] != "ok":
        pytest.skip(f"this kernel runs no x86 (int 0x80) code: {bare['x86 getpid']}")
    for prefix in ("", "x86 ", "x32 "):
        assert got[prefix + "unshare(NEWUSER)"] == "EPERM", got
        assert got[prefix + "keyctl"] == "EPERM", got
    assert got["clone3"] == got["x86 clone3"] == "ENOSYS", got
    assert got["getpid"] == got["x86 getpid"] == "ok", got
    # x32 calls reach the rules (and, allowed, the kernel: ENOSYS where it has no x32 support)
    assert got["x32 getpid"] == bare["x32 getpid"], (got, bare)
    # the negative control: without the rules the same calls do not fail with EPERM
    assert bare["unshare(NEWUSER)"] == bare["x86 unshare(NEWUSER)"] == "ok", bare
    assert bare["keyctl"] == bare["x86 keyctl"] == "ok", bare
    assert bare["x32 unshare(NEWUSER)"] != "EPERM" and bare["clone3"] != "ENOSYS", bare


def _launch(request: dict) -> subprocess.CompletedProcess:
    fd = os.memfd_create("test-launch")
    try:
        os.write(fd, marshal.dumps(request))
        os.lseek(fd, 0, os.SEEK_SET)
        return subprocess.run([sys.executable, "-I", "-S", str(LAUNCH), str(fd)], pass_fds=(fd,), env={},
                              capture_output=True, timeout=60)
    finally:
        os.close(fd)


# SPEC: GYM-10
@pytest.mark.parametrize("seccomp", [None, b"", b"\0" * 7])
def test_gym_10_the_launcher_refuses_a_request_without_a_filter(tmp_path, seccomp):
    procs = tmp_path / "cgroup.procs"
    request = {"pid": os.getpid(), "cgroups": [str(procs)], "uid": 65534, "gid": 65534, "groups": [],
               "caps": 0, "argv": ["/bin/true"], "env": {}}
    if seccomp is not None:
        request["seccomp"] = seccomp
    r = _launch(request)
    assert r.returncode == 125 and b"no seccomp filter" in r.stderr, r
    assert not procs.exists()  # refused before it joined a cgroup or entered anything


# SPEC: GYM-10
def test_gym_10_the_keeper_refuses_to_start_a_sandbox_without_a_filter(tmp_path):
    folder = tmp_path / "sandbox"
    folder.mkdir()
    cfg = {"dir": str(folder), "cgroups": [], "lower": str(tmp_path), "storage_mb": None}
    r = subprocess.run([sys.executable, "-I", "-S", str(KEEPER), json.dumps(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3 and "no seccomp filter" in json.loads(r.stdout)["error"], r
    assert folder.exists() and not any(folder.iterdir())  # nothing mounted or made


# SPEC: GYM-10
def test_gym_10_no_libseccomp_refuses_the_local_backend(monkeypatch):
    def missing():
        raise OSError("libseccomp.so.2: cannot open shared object file")

    _seccomp._cached.cache_clear()
    monkeypatch.setattr(_seccomp, "_libseccomp", missing)
    try:
        reason = _seccomp.unavailable_reason(CAPS)
        assert reason and "libseccomp" in reason and "GYM-10" in reason, reason
        if os.geteuid() == 0 and all(local_sandbox.shutil.which(t) for t in ("bwrap", "nsenter", "unshare")):
            assert local_sandbox.local_unavailable_reason() == reason
    finally:
        _seccomp._cached.cache_clear()
