"""GYM-10 on the local (bubblewrap) backend: a root agent cannot get host privileges, reach the host's network or a
sibling, or grow the host's disk past its sandbox's storage bound.

Privilege: the agent (root in its sandbox) replaces a file that a host-privileged helper would run or map on the next
command — ``setpriv``, ``/bin/sh``, libc, ``ld-linux`` or ``/etc/ld.so.preload`` — with a payload (built here with
the host's gcc) that records its uid and effective capabilities in ``/hg-evidence`` and tries to escape: read a
host-only file directly, make a device node for the host's disk, mount it, read that file and write a marker onto
the host. At the next commands nothing host-privileged happens: every run of the payload holds at most the sandbox's
capability set (Docker's default minus ``mknod``), never ``CAP_SYS_ADMIN``; the host file is never read and the
marker never written. (Before the launcher, the replaced ``setpriv`` ran as host root with every capability.)
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from harbor_gym.config import EnvConfig, host_settings
from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.local import LocalSandbox
from harbor_gym.sandbox.local import _net
from harbor_gym.sandbox.local._exec import CAP_MASK

from .helpers import BASE_IMAGE, LABEL, LOCAL, config, grade, run_episode, toml, write_task

pytestmark = pytest.mark.bwrap

CAP_SYS_ADMIN = 1 << 21
CAP_MKNOD = 1 << 27
LIBDIR = "/usr/lib/x86_64-linux-gnu"

_PAYLOAD_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void note(int fd, const char *what, int rc) {
    char line[256];
    int n = snprintf(line, sizeof line, "%s=%d\n", what, rc == 0 ? 0 : errno);
    write(fd, line, n);
}

static void copy_secret(int out, const char *tag, const char *path) {
    char buf[512];
    int s = open(path, O_RDONLY);
    if (s < 0) return;
    int n = read(s, buf, sizeof buf);
    close(s);
    if (n > 0) { write(out, tag, strlen(tag)); write(out, buf, n); write(out, "\n", 1); }
}

static void attempt(void) {
    int fd = open("/hg-evidence", O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd < 0) return;
    char buf[4096];
    int st = open("/proc/self/status", O_RDONLY);
    int n = st >= 0 ? read(st, buf, sizeof buf - 1) : 0;
    if (st >= 0) close(st);
    buf[n > 0 ? n : 0] = 0;
    char *cap = strstr(buf, "CapEff:");
    char line[128];
    int m = snprintf(line, sizeof line, "run uid=%d cap=%.24s\n", (int)getuid(), cap ? cap + 7 : "?");
    write(fd, line, m);
    copy_secret(fd, "secret-direct:", SECRET);
    note(fd, "mknod", mknod("/hg-disk", S_IFBLK | 0600, makedev(DISK_MAJOR, DISK_MINOR)));
    mkdir("/hg-mnt", 0700);
    int rc = mount("/hg-disk", "/hg-mnt", FSTYPE, 0, NULL);
    note(fd, "mount", rc);
    if (rc == 0) {
        copy_secret(fd, "secret-mount:", "/hg-mnt" SECRET);
        int w = open("/hg-mnt" MARKER, O_WRONLY | O_CREAT, 0644);
        note(fd, "marker", w < 0 ? -1 : 0);
        if (w >= 0) close(w);
        umount2("/hg-mnt", MNT_DETACH);
    }
    close(fd);
}

#ifdef AS_LIBRARY
__attribute__((constructor)) static void payload_init(void) { attempt(); }
#else
int main(void) { attempt(); return 0; }
#endif
"""


#: The same attempt without libc (raw syscalls), so that it also runs as an ELF interpreter (a replaced ld-linux).
_FREESTANDING_C = r"""
static long sc(long n, long a, long b, long c, long d, long e) {
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
    return r;
}
static long len(const char *s) { long n = 0; while (s[n]) n++; return n; }
static void put(long fd, const char *s) { sc(1, fd, (long)s, len(s), 0, 0); }
static void num(long fd, long v) {
    char b[24]; int i = 23; b[i] = 0; int neg = v < 0; if (neg) v = -v;
    do { b[--i] = '0' + v % 10; v /= 10; } while (v);
    if (neg) b[--i] = '-';
    put(fd, b + i);
}
static void note(long fd, const char *what, long rc) { put(fd, what); put(fd, "="); num(fd, rc < 0 ? -rc : 0); put(fd, "\n"); }
static void copy_secret(long out, const char *tag, const char *path) {
    char buf[512]; long s = sc(2, (long)path, 0, 0, 0, 0);
    if (s < 0) return;
    long n = sc(0, s, (long)buf, sizeof buf, 0, 0); sc(3, s, 0, 0, 0, 0);
    if (n > 0) { put(out, tag); sc(1, out, (long)buf, n, 0, 0); put(out, "\n"); }
}
static void attempt(void) {
    long fd = sc(2, (long)"/hg-evidence", 02000 | 0100 | 01, 0666, 0, 0);  /* O_APPEND|O_CREAT|O_WRONLY */
    if (fd < 0) return;
    static char buf[4096];
    long st = sc(2, (long)"/proc/self/status", 0, 0, 0, 0);
    long n = st >= 0 ? sc(0, st, (long)buf, sizeof buf - 1, 0, 0) : 0;
    buf[n > 0 ? n : 0] = 0;
    char *cap = 0;
    for (long i = 0; i + 7 < n; i++)
        if (buf[i] == 'C' && buf[i+1] == 'a' && buf[i+2] == 'p' && buf[i+3] == 'E' && buf[i+4] == 'f') { cap = buf + i + 7; break; }
    put(fd, "run uid="); num(fd, sc(102, 0, 0, 0, 0, 0)); put(fd, " cap=");
    if (cap) { long k = 0; while (cap[k] == '\t' || cap[k] == ' ') cap++; while (cap[k] && cap[k] != '\n') k++; sc(1, fd, (long)cap, k, 0, 0); }
    put(fd, "\n");
    copy_secret(fd, "secret-direct:", SECRET);
    long dev = ((long)(DISK_MAJOR & 0xfff) << 8) | (DISK_MINOR & 0xff) | ((long)(DISK_MINOR & ~0xff) << 12);
    note(fd, "mknod", sc(133, (long)"/hg-disk", 060000 | 0600, dev, 0, 0));
    sc(83, (long)"/hg-mnt", 0700, 0, 0, 0);
    long rc = sc(165, (long)"/hg-disk", (long)"/hg-mnt", (long)FSTYPE, 0, 0);
    note(fd, "mount", rc);
    if (rc == 0) {
        copy_secret(fd, "secret-mount:", "/hg-mnt" SECRET);
        long w = sc(2, (long)("/hg-mnt" MARKER), 0100 | 01, 0644, 0, 0);
        note(fd, "marker", w < 0 ? w : 0);
        sc(166, (long)"/hg-mnt", 2, 0, 0, 0);
    }
    sc(3, fd, 0, 0, 0, 0);
}
void _start(void) { attempt(); sc(231, 0, 0, 0, 0, 0); for (;;) {} }
"""


@pytest.fixture(scope="module")
def settings() -> SandboxSettings:
    return SandboxSettings.from_config(EnvConfig(labels=dict([LABEL])))


@pytest.fixture(scope="module")
def rootfs() -> Path:
    return Path(host_settings().rootfs_aliases[BASE_IMAGE])


@pytest.fixture
def host_secret():
    """A host-only file (outside every rootfs and sandbox folder) and the host path of a marker no one may write."""
    tag = uuid.uuid4().hex[:12]
    secret = Path(f"/var/tmp/hg-secret-{tag}")
    marker = Path(f"/var/tmp/hg-marker-{tag}")
    secret.write_text(f"HOST-ONLY-{tag}")
    secret.chmod(0o600)
    yield secret, marker
    secret.unlink(missing_ok=True)
    if marker.exists():
        marker.unlink()


@pytest.fixture
def payloads(tmp_path, host_secret, rootfs):
    """Build the payloads with the host's gcc: a static-pie program, a preload library, a trojaned libc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the payloads")
    secret, marker = host_secret
    dev = os.stat(secret.parent).st_dev
    fstype = next((line.split()[2] for line in Path("/proc/self/mounts").read_text().splitlines()
                   if line.split()[1] == "/"), "ext4")
    src = tmp_path / "payload.c"
    src.write_text(_PAYLOAD_C)
    defs = [f'-DSECRET="{secret}"', f'-DMARKER="{marker}"', f"-DDISK_MAJOR={os.major(dev)}",
            f"-DDISK_MINOR={os.minor(dev)}", f'-DFSTYPE="{fstype}"']
    out = {}

    def cc(*args):
        subprocess.run([gcc, *defs, *args], check=True, capture_output=True)

    free = tmp_path / "freestanding.c"
    free.write_text(_FREESTANDING_C)
    out["static"] = tmp_path / "static-payload"
    cc("-O1", "-static", "-nostdlib", "-fno-pie", "-no-pie", "-fno-stack-protector", "-o", str(out["static"]),
       str(free))
    out["preload"] = tmp_path / "preload.so"
    cc("-O1", "-shared", "-fPIC", "-DAS_LIBRARY", "-o", str(out["preload"]), str(src))
    # A libc that works (it pulls the real one in under another file name) and runs the payload in every process.
    real = (rootfs / LIBDIR.lstrip("/") / "libc.so.6").read_bytes()
    (tmp_path / "libhgr.so").write_bytes(real.replace(b"libc.so.6\0", b"libhgr.so\0", 1))
    dump = subprocess.run(["objdump", "-p", str(rootfs / LIBDIR.lstrip("/") / "libc.so.6")], capture_output=True,
                          text=True, check=True).stdout
    versions = sorted({w for w in dump.split() if w.startswith("GLIBC_")})
    (tmp_path / "ver.map").write_text("".join(f"{v} {{ }};\n" for v in versions))
    out["libc"] = tmp_path / "libc.so.6"
    cc("-O1", "-shared", "-fPIC", "-DAS_LIBRARY", "-nostdlib", "-Wl,-soname,libhgpay.so",
       f"-Wl,--version-script={tmp_path / 'ver.map'}", "-Wl,--no-as-needed", "-o", str(out["libc"]), str(src),
       str(tmp_path / "libhgr.so"))
    return out


def _evidence(sb: LocalSandbox) -> list[str]:
    data = sb.read_file("/hg-evidence", max_bytes=1 << 20)  # a host-side read beneath the sandbox's root
    return (data or b"").decode(errors="replace").splitlines()


def _assert_nothing_privileged(lines: list[str], host_secret) -> None:
    secret, marker = host_secret
    text = "\n".join(lines)
    assert secret.read_text() not in text, text
    assert not marker.exists(), "the payload wrote onto the host"
    for line in lines:
        if line.startswith("run "):
            cap = int(line.split("cap=")[1].strip().split()[0], 16)
            assert cap & ~CAP_MASK == 0, line
            assert not cap & CAP_SYS_ADMIN and not cap & CAP_MKNOD, line
        if line.startswith("mount="):
            assert line != "mount=0", text


def _stage(sb: LocalSandbox, local: Path, dest: str) -> None:
    sb.put(local, "/hg-stage/" + local.name, mode=0o755)
    r = sb.exec(["/bin/mv", "-f", "/hg-stage/" + local.name, dest], timeout=30, user="root")
    assert r.exit_code == 0, r


def _trigger(sb: LocalSandbox) -> None:
    """The next commands a harness would run: a script, an argv as another user, a root tar (file transfer)."""
    sb.exec("echo hello", timeout=30)
    sb.exec(["/usr/bin/id"], timeout=30, user="nobody")
    try:
        sb.put_bytes(b"x", "/tmp/after")
    except Exception:  # with ld.so replaced, the sandbox's tar cannot run: that is the agent's loss, not ours
        pass


# SPEC: GYM-10
def test_replaced_setpriv_never_runs_with_host_privileges(settings, payloads, host_secret):
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        _stage(sb, payloads["static"], "/usr/bin/setpriv")
        _trigger(sb)
        lines = _evidence(sb)
        _assert_nothing_privileged(lines, host_secret)
        # No host helper runs the sandbox's setpriv any more; if anything ran it, it ran bounded (checked above).
        r = sb.exec("grep CapEff /proc/self/status", timeout=30)
        assert int(r.stdout.split()[1], 16) == CAP_MASK


# SPEC: GYM-10
@pytest.mark.parametrize("what", ["sh", "ld-linux", "libc", "ld.so.preload"])
def test_replaced_loader_files_run_only_with_the_sandbox_capabilities(settings, payloads, host_secret, what):
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        if what == "sh":
            _stage(sb, payloads["static"], "/usr/bin/dash")
        elif what == "ld-linux":
            _stage(sb, payloads["static"], f"{LIBDIR}/ld-linux-x86-64.so.2")
        elif what == "libc":
            r = sb.exec(["/bin/cp", f"{LIBDIR}/libc.so.6", f"{LIBDIR}/libhgr.so"], timeout=30)
            assert r.exit_code == 0, r
            _stage(sb, payloads["libc"], f"{LIBDIR}/libc.so.6")
        else:
            sb.put(payloads["preload"], "/hg-preload.so", mode=0o755)
            sb.put_bytes(b"/hg-preload.so\n", "/etc/ld.so.preload")
        _trigger(sb)
        lines = _evidence(sb)
        runs = [line for line in lines if line.startswith("run ")]
        assert runs, f"the payload never ran: {lines}"  # the attack is real: the replaced file is used
        assert any(" uid=0 " in f" {line} " for line in runs), lines  # ... also by root commands
        _assert_nothing_privileged(lines, host_secret)
        assert "mknod=0" not in lines  # no device node for the host's disk


def _host_server(host: str) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, 0))
    srv.listen(16)
    srv.setblocking(False)
    return srv


def _accepted(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    import json

    return sorted({a["local"] for link in json.loads(out) for a in link.get("addr_info", [])})


_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1); print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('REFUSED', e)\n")


def _connect(sb: LocalSandbox, host: str, port: int) -> str:
    return sb.exec(["python3", "-c", _CONNECT, host, str(port)], timeout=20).stdout.strip()


# SPEC: GYM-10
def test_public_local_sandbox_reaches_no_host_service(settings):
    if _net.filter_unavailable_reason():
        pytest.skip(f"no host filter here: {_net.filter_unavailable_reason()}")
    loop, anyaddr = _host_server("127.0.0.1"), _host_server("0.0.0.0")
    try:
        with LocalSandbox(SandboxSpec(image=BASE_IMAGE, network=True), settings) as sb:
            targets = [("127.0.0.1", loop), ("127.0.0.1", anyaddr), (str(_net._gateway()), anyaddr)]
            targets += [(addr, anyaddr) for addr in _host_addresses() if not addr.startswith("127.")]
            for host, srv in targets:
                out = _connect(sb, host, srv.getsockname()[1])
                assert "CONNECTED" not in out, (host, out)
            assert not _accepted(loop) and not _accepted(anyaddr)
            # the sandbox does have a network of its own (eth0 with an address on the bridge, a default route)
            assert set(sb.exec("ls /sys/class/net", timeout=10).stdout.split()) == {"eth0", "lo"}
    finally:
        loop.close()
        anyaddr.close()


# SPEC: GYM-10
def test_two_public_local_sandboxes_cannot_reach_each_other(settings):
    if _net.filter_unavailable_reason():
        pytest.skip(f"no host filter here: {_net.filter_unavailable_reason()}")
    spec = SandboxSpec(image=BASE_IMAGE, network=True)
    with LocalSandbox(spec, settings) as a, LocalSandbox(spec, settings) as b:
        listen = ("import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                  "s.bind(('0.0.0.0', 7777)); s.listen(); open('/tmp/ready', 'w').close(); s.accept()\n")
        b.exec(f"python3 -c {shlex.quote(listen)} >/dev/null 2>&1 &", timeout=10)
        b.exec("for i in $(seq 50); do [ -e /tmp/ready ] && break; sleep 0.1; done", timeout=10)
        assert "CONNECTED" in _connect(b, "127.0.0.1", 7777)  # the listener is up (the check below can fail)
        assert a._address and b._address and a._address != b._address
        assert "CONNECTED" not in _connect(a, b._address, 7777)


# SPEC: GYM-10
def test_public_network_refused_where_the_filter_cannot_be_installed(settings, monkeypatch):
    monkeypatch.setattr(_net, "filter_unavailable_reason", lambda: "simulated: no iptables")
    sb = LocalSandbox(SandboxSpec(image=BASE_IMAGE, network=True), settings)
    with pytest.raises(SandboxUnavailableError) as info:
        sb.start()
    assert info.value.rule == "GYM-10" and "filter" in str(info.value) and "unfiltered_network" in str(info.value)
    assert not sb.folder.exists()
    # a sandbox without network is not affected
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE, network=False), settings) as ok:
        assert ok.exec("true", timeout=10).exit_code == 0


def _allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


# SPEC: GYM-10
@pytest.mark.parametrize("writer", [
    "dd if=/dev/zero of=/fill bs=1M count=1024 2>&1; sync",
    "fallocate -l 1G /fill 2>&1; fallocate -l 200M /fill2 2>&1; fallocate -l 200M /fill3 2>&1",
])
def test_storage_bound_holds_against_dd_and_fallocate(settings, writer):
    mib = 1 << 20
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE, storage_mb=256), settings) as sb:
        assert not sb.storage_exceeded()
        r = sb.exec(writer + "; echo; du -skc /fill* 2>/dev/null | tail -1", timeout=120)
        assert "No space left on device" in r.stdout + r.stderr, r
        used_kib = int(r.stdout.strip().splitlines()[-1].split()[0])
        assert used_kib * 1024 <= (256 + 128) * mib, r.stdout
        assert sb.storage_exceeded()  # the engine can name the cause
        image = sb.folder / "layer.img"
        assert _allocated_bytes(image) <= (256 + 128) * mib  # the host disk grew by at most the bound
        text = textwrap.shorten(r.stdout, 200)
        assert sb.exec("echo still-alive", timeout=30).stdout.strip() == "still-alive", text


# SPEC: GYM-10
def test_local_task_with_storage_mb_256_runs_and_a_filler_ends_the_turn_as_storage_exceeded(tmp_path):
    # The task runs on the local backend (graded 1.0) within its bound; a disk filler leaves the verifier no room
    # for its reward and the turn names the cause (harbor_gym:storage_exceeded, "storage").
    files = {"task.toml": toml(["s1"], env="storage_mb = 256"), "tests/test.sh": grade("[ -f /app/done ]")}
    cfg = config(LOCAL)
    results, final = run_episode(write_task(tmp_path, files, name="local-storage-ok"), "touch /app/done", cfg)
    assert final.graded and final.reward == 1.0 and results[0].record.failure_kind is None
    # big writes first, then small ones (ext4 refuses a 4 MiB write with ~2 MiB left), as a real filler would
    fill = ("dd if=/dev/zero of=/fill bs=4M count=1000 2>/dev/null; dd if=/dev/zero of=/fill2 bs=4k 2>/dev/null; "
            "touch /app/done; sync")
    results, final = run_episode(write_task(tmp_path, files, name="local-storage-full"), fill, cfg)
    rec = results[0].record
    assert rec.failure_kind == "harbor_gym:storage_exceeded" and "storage" in (rec.failure_message or ""), rec
    assert not final.graded


# SPEC: GYM-10
def test_local_episode_gets_the_default_storage_and_memory_bounds(tmp_path):
    # A task setting neither storage_mb nor memory_mb gets EnvConfig's defaults on the local backend too: a
    # 10240 MiB ext4 layer (sparse on the host) and a 4096 MiB memory cgroup.
    from harbor_gym.episode import Episode
    from harbor_gym.task import load_task

    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": grade("true")}, name="local-defaults")
    cfg = config(LOCAL)
    with Episode(load_task(task, cfg), cfg) as ep:
        ep.start()
        sb = ep._sandbox
        assert sb.spec.storage_mb == 10240 and sb.spec.memory_mb == 4096
        df = sb.exec(["df", "-k", "--output=size", "/"], timeout=30).stdout.split()
        assert 9 * (1 << 20) < int(df[-1]) <= 10240 * 1024  # KiB: the bound is the filesystem's size
        assert _allocated_bytes(sb.folder / "layer.img") < 256 << 20  # sparse: only what is written
        limit = sb.exec("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null",
                        timeout=30).stdout.split()
        assert str(4096 << 20) in limit


_LISTEN = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('0.0.0.0', 7777)); s.listen(); open('/tmp/ready', 'w').close()\n"
           "while True:\n    s.accept()[0].close()\n")


def _listen(sb) -> None:
    sb.exec(f"python3 -c {shlex.quote(_LISTEN)} >/dev/null 2>&1 &", timeout=10)
    sb.exec("for i in $(seq 50); do [ -e /tmp/ready ] && break; sleep 0.1; done", timeout=10)
    assert "CONNECTED" in _connect(sb, "127.0.0.1", 7777)  # the listener is up (so a refusal below means something)


# SPEC: GYM-10
@pytest.mark.docker
def test_local_and_docker_public_sandboxes_cannot_reach_each_other(settings, docker_client):
    # Sandboxes of both backends on one host: neither bridge forwards into the other, whatever order Docker keeps
    # its own FORWARD rules in (the local guard sits in the mangle table).
    if _net.filter_unavailable_reason():
        pytest.skip(f"no host filter here: {_net.filter_unavailable_reason()}")
    from harbor_gym import sandbox as sandbox_pkg

    spec = SandboxSpec(image=BASE_IMAGE, network=True, name_hint="cross")
    with LocalSandbox(spec, settings) as local, sandbox_pkg.open(spec, backend="docker", settings=settings) as dock:
        nets = docker_client.api.inspect_container(dock.container_id)["NetworkSettings"]["Networks"]
        dock_ip = next(n["IPAddress"] for n in nets.values() if n.get("IPAddress"))
        _listen(local)
        _listen(dock)
        assert "CONNECTED" not in _connect(dock, local._address, 7777)
        assert "CONNECTED" not in _connect(local, dock_ip, 7777)


# SPEC: GYM-10
def test_a_filter_table_accept_above_ours_opens_nothing(settings):
    # Docker (or another firewall) may put ACCEPT rules above ours in the filter table at any time; the guard in
    # the mangle table still keeps the host and the siblings out of reach.
    if _net.filter_unavailable_reason():
        pytest.skip(f"no host filter here: {_net.filter_unavailable_reason()}")
    spec = SandboxSpec(image=BASE_IMAGE, network=True)
    rules = [["FORWARD", "-i", _net.BRIDGE, "-j", "ACCEPT"], ["INPUT", "-i", _net.BRIDGE, "-j", "ACCEPT"]]
    srv = _host_server("0.0.0.0")
    with LocalSandbox(spec, settings) as a, LocalSandbox(spec, settings) as b:
        for rule in rules:
            subprocess.run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]], check=True)
        try:
            _listen(b)
            out = sb_out = _connect(a, b._address, 7777)
            assert "CONNECTED" not in out, sb_out
            for host in [str(_net._gateway())] + [h for h in _host_addresses() if not h.startswith("127.")]:
                assert "CONNECTED" not in _connect(a, host, srv.getsockname()[1]), host
            assert not _accepted(srv)
        finally:
            for rule in rules:
                subprocess.run(["iptables", "-w", "-D", rule[0], *rule[1:]], check=False)
            srv.close()


# SPEC: GYM-10
@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("freeze", [True, False], ids=["freeze", "nofreeze"])
def test_local_episode_root_agent_preload_gains_nothing_on_the_host(tmp_path, payloads, host_secret, mode, freeze):
    # A whole episode on the local backend: the root agent installs /etc/ld.so.preload; every later command of the
    # harness in its sandbox (collect hook, clean-up, the shared verifier) loads the payload, yet each run of it
    # holds at most the sandbox's capabilities and the host file stays unread and unwritten.
    files = {
        "task.toml": toml(["s1", "s2"], tail=f'[verifier]\nenvironment_mode = "{mode}"\n'
                          '[[verifier.collect]]\ncommand = "cp /hg-evidence /logs/artifacts/evidence || true"\n'),
        "environment/preload.so": payloads["preload"].read_bytes(),
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    }
    task = write_task(tmp_path / "tasks", files, name=f"preload-{mode}")
    attack = "cp /app/preload.so /hg-preload.so && echo /hg-preload.so > /etc/ld.so.preload && ls >/dev/null"
    results, final = run_episode(task, [attack, ":"], config(LOCAL, freeze_agent_during_verify=freeze,
                                                              logs_root=str(tmp_path / "logs")))
    assert final.graded and final.reward == 1.0, [r.record for r in results]
    evidence = sorted((tmp_path / "logs").rglob("evidence"))
    assert evidence, "the collect hook found no evidence: the payload never ran"
    lines = [line for path in evidence for line in path.read_text(errors="replace").splitlines()]
    assert any(line.startswith("run uid=0 ") for line in lines), lines
    _assert_nothing_privileged(lines, host_secret)


# SPEC: GYM-10
def test_command_output_never_lands_in_a_host_file(settings):
    # A command's stdout/stderr and PID 1's stderr are pipes the host reads into capped buffers: a flood (or a
    # process reopening them through /proc/<pid>/fd) costs the host no disk, and the result says what was cut.
    small = SandboxSettings(image_aliases=settings.image_aliases, rootfs_aliases=settings.rootfs_aliases,
                            output_cap_bytes=4096)
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), small) as sb:
        r = sb.exec("readlink /proc/self/fd/1 /proc/self/fd/2 /proc/1/fd/2", timeout=30)
        kinds = r.stdout.split()
        assert len(kinds) == 3 and all(k.startswith("pipe:") for k in kinds), r
        r = sb.exec("head -c 300000000 /dev/zero | tr '\\0' x; (yes > /proc/1/fd/2 &) ; echo done >&2", timeout=60)
        assert r.stdout_truncated and "cut at 4096 bytes of 300000000" in r.stdout, r.stdout[-200:]
        assert r.stderr.strip() == "done"
        # a writer left behind on the exec's pipe neither blocks nor dies: the sandbox's drainer reads it
        sb.exec("(while :; do head -c 65536 /dev/zero || exit; echo >> /tmp/count; sleep 0.01; done) & echo started",
                timeout=30)
        grows = sb.exec("sleep 0.3; a=$(wc -c < /tmp/count); sleep 0.5; b=$(wc -c < /tmp/count); "
                        "[ $b -gt $a ] && echo grows", timeout=30)
        assert grows.stdout.strip() == "grows", grows


# SPEC: GYM-10
def test_replaced_tar_cannot_fill_the_host_at_the_next_upload(settings):
    # put() runs the sandbox's own tar as root; a root agent made it an endless writer. The host keeps at most
    # 64 KiB of it and stops it at once: the upload fails fast, naming the copy, and nothing grows on the host.
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        sb.put_bytes(b"#!/bin/sh\nexec yes flood\n", "/hg-stage/tar", mode=0o755)
        assert sb.exec(["/bin/mv", "-f", "/hg-stage/tar", "/usr/bin/tar"], timeout=30).exit_code == 0
        import time

        t0 = time.monotonic()
        with pytest.raises(Exception) as info:
            sb.put_bytes(b"data", "/tmp/after-flood")
        assert time.monotonic() - t0 < 30
        assert "exit 250" in str(info.value), info.value


# SPEC: GYM-10
def test_root_cannot_set_host_wide_kernel_settings(settings):
    # Root in a local sandbox is uid 0 of the host's user namespace: a writable /proc/sys would let it set
    # kernel.core_pattern to a program the host's kernel runs as host root at the next crash. It is read-only, as
    # in Docker (the test writes back the value already there, so a failure changes nothing on the host).
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        r = sb.exec('v=$(cat /proc/sys/kernel/core_pattern); (printf "%s\\n" "$v" > /proc/sys/kernel/core_pattern) '
                    '2>&1; echo rc=$?; (echo 1 > /proc/sys/vm/drop_caches) 2>&1; echo rc=$?', timeout=30)
        assert r.stdout.count("Read-only file system") == 2 and "rc=0" not in r.stdout, r
        # masked host-wide information, as Docker masks it
        r = sb.exec("cat /proc/keys 2>/dev/null | wc -c; ls -A /sys/firmware 2>/dev/null | wc -l", timeout=30)
        assert r.stdout.split() == ["0", "0"], r
        # and what is per sandbox still reads as the sandbox's own
        assert sb.exec("cat /proc/sys/kernel/hostname", timeout=30).stdout.strip() == sb.name[:63]


# SPEC: GYM-10
def test_commands_do_not_share_the_trainers_session_keyring(settings):
    # Root in a local sandbox is host uid 0: in the trainer's session keyring it could read or plant keys. The
    # seccomp filter denies keyctl outright (as Docker's profile does); beneath it, every command (and the sandbox's
    # PID 1) joins a fresh session keyring, checked here with an allow-all filter in the launcher.
    import ctypes

    from harbor_gym.sandbox.local import _exec, _seccomp

    sys_keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if sys_keyctl is None:
        pytest.skip("keyctl number unknown on this machine")
    ours = ctypes.CDLL(None).syscall(sys_keyctl, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of @s
    probe = (f"import ctypes, os; l = ctypes.CDLL(None, use_errno=True); r = l.syscall({sys_keyctl}, 0, -3, 0);"
             " print(r if r > 0 else -ctypes.get_errno())")
    users = ("root", "root", "nobody")
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE), settings) as sb:
        filtered = {int(sb.exec(["python3", "-c", probe], timeout=30, user=u).stdout) for u in users}
        real = _seccomp.program
        try:
            _exec._seccomp.program = lambda caps: _seccomp.allow_all_program()
            ids = {int(sb.exec(["python3", "-c", probe], timeout=30, user=u).stdout) for u in users}
        finally:
            _exec._seccomp.program = real
    assert filtered == {-1}, filtered  # -EPERM: no keyring at all
    assert ours > 0 and ours not in ids and len(ids) == 3, (ours, ids)


# SPEC: GYM-10
def test_public_task_is_refused_at_seed_where_the_local_filter_cannot_be_installed(tmp_path, monkeypatch):
    from harbor_gym.errors import SeedRefusedError

    monkeypatch.setattr(_net, "filter_unavailable_reason", lambda: "simulated: no iptables")
    files = {"task.toml": toml(["s1"]).replace('network_mode = "no-network"', 'network_mode = "public"'),
             "tests/test.sh": grade("true")}
    task = write_task(tmp_path, files, name="local-public")
    with pytest.raises(SeedRefusedError) as info:
        run_episode(task, ":", config(LOCAL))
    text = str(info.value)
    assert "filter" in text and "unfiltered_network" in text and "127.0.0.1" in text, text
    assert not info.value.retryable


# SPEC: GYM-10
def test_unfiltered_network_allow_runs_the_public_sandbox_unfiltered(settings, monkeypatch):
    # The documented way out where no filter can be installed: "allow" shares the host's network namespace.
    import dataclasses

    monkeypatch.setattr(_net, "filter_unavailable_reason", lambda: "simulated: no iptables")
    allow = dataclasses.replace(settings, unfiltered_network="allow")
    with LocalSandbox(SandboxSpec(image=BASE_IMAGE, network=True), allow) as sb:
        assert os.readlink(f"/proc/{sb.pid}/ns/net") == os.readlink("/proc/self/ns/net")
        assert sb.exec("true", timeout=30).exit_code == 0
