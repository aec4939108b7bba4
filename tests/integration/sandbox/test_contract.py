"""The sandbox contract, one suite over the backends (``docker``, rootful and rootless ``podman``, ``local``), proved by effects inside the
sandbox: users, env and cwd, exit codes, output caps, prompt return, timeout kills, put/get round trips, refusal of
escaping archives, no network, limits, and leases that expire by themselves.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from harbor_gym.errors import ArchiveError, SandboxError, SandboxPathError, SandboxUnavailableError
from harbor_gym.sandbox import SandboxState, lease as leases


def _host_address() -> str:
    """An address of this machine (never another host): the docker bridge gateway, else the primary address."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it only picks the source address
        return probe.getsockname()[0]
    except OSError:
        return "172.17.0.1"
    finally:
        probe.close()


# --- exec -------------------------------------------------------------------------------------------------


def test_exec_as_root_and_as_named_user(sandbox_factory):
    sb = sandbox_factory()
    assert sb.state is SandboxState.RUNNING
    root = sb.exec("id -u; id -un", timeout=10)
    assert root.ok and root.stdout.split() == ["0", "root"]
    nobody = sb.exec("id -u; id -un", timeout=10, user="nobody")
    assert nobody.ok and nobody.stdout.split() == ["65534", "nobody"]
    by_uid = sb.exec(["id", "-u"], timeout=10, user="65534")
    assert by_uid.stdout.strip() == "65534"


def test_exec_env_and_cwd(sandbox_factory):
    sb = sandbox_factory(workdir="/app", env={"BASE": "spec", "OVER": "spec"})
    assert sb.workdir == "/app"
    r = sb.exec('pwd; echo "$BASE $OVER $EXTRA"', timeout=10, env={"OVER": "exec", "EXTRA": "x y"})
    assert r.stdout.splitlines() == ["/app", "spec exec x y"]
    r = sb.exec("pwd", timeout=10, cwd="/tmp")
    assert r.stdout.strip() == "/tmp"
    with pytest.raises(SandboxPathError):
        sb.exec("pwd", timeout=10, cwd="/no/such/folder")


def test_exec_exit_codes_and_argv(sandbox_factory):
    sb = sandbox_factory()
    assert sb.exec("exit 7", timeout=10).exit_code == 7
    assert sb.exec("true", timeout=10).exit_code == 0
    r = sb.exec(["sh", "-c", 'echo "$0|$1"; echo err >&2; exit 3', "a b", "c'd"], timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "a b|c'd\n", "err\n")
    assert not r.ok and not r.timed_out
    assert sb.exec("cat", timeout=10, stdin=b"fed on stdin").stdout == "fed on stdin"


def test_exec_output_is_capped_with_a_marker(sandbox_factory, settings_with):
    sb = sandbox_factory(settings=settings_with(output_cap_bytes=4096))
    r = sb.exec("head -c 10000 /dev/zero | tr '\\0' a; head -c 9000 /dev/zero | tr '\\0' b >&2", timeout=10)
    assert r.stdout_truncated and r.stderr_truncated
    assert r.stdout.startswith("a" * 4096) and "output cut at 4096 bytes" in r.stdout
    assert r.stdout.split("\n[")[0] == "a" * 4096
    assert r.stderr.split("\n[")[0] == "b" * 4096 and "output cut at 4096 bytes" in r.stderr
    small = sb.exec("echo small", timeout=10)
    assert not small.stdout_truncated and small.stdout == "small\n"


def test_exec_returns_promptly_when_background_processes_remain(sandbox_factory):
    sb = sandbox_factory()
    t0 = time.monotonic()
    r = sb.exec("sleep 30 & echo started", timeout=20)
    elapsed = time.monotonic() - t0
    assert r.ok and r.stdout == "started\n"
    assert elapsed < 1.5, f"exec waited {elapsed:.2f} s for a background process"
    # the background process was left running (returning early must not kill it)
    assert sb.exec("pgrep -x sleep >/dev/null && echo alive", timeout=10).stdout == "alive\n"


def test_exec_timeout_kills_the_whole_process_group(sandbox_factory):
    sb = sandbox_factory()
    t0 = time.monotonic()
    r = sb.exec("sleep 600 & sleep 600; echo never", timeout=1.5)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.ok
    assert 1.4 <= elapsed < 6, elapsed
    assert "never" not in r.stdout
    left = sb.exec("ps -eo args | grep -c '^sleep 600' || true", timeout=10)
    assert left.stdout.strip() == "0", "sleep 600 survived its timeout"


# --- files ------------------------------------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "secret.txt").write_text("s3cret")
    (root / "secret.txt").chmod(0o600)
    (root / "sub" / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "sub").chmod(0o750)


def test_put_and_get_round_trip_modes_and_owners(sandbox_factory, tmp_path):
    sb = sandbox_factory()
    src = tmp_path / "src"
    _tree(src)
    sb.put(src, "/opt/put/here", owner="nobody", mode=0o775)
    listing = sb.exec("cd /opt/put/here && stat -c '%n %a %U' . run.sh secret.txt sub sub/data.bin", timeout=10)
    assert listing.stdout.splitlines() == [
        ". 775 nobody", "run.sh 755 nobody", "secret.txt 600 nobody", "sub 750 nobody", "sub/data.bin 644 nobody",
    ]
    assert sb.exec("stat -c '%U' /opt/put", timeout=10).stdout.strip() == "root"  # created parent: root
    assert sb.exec("/opt/put/here/run.sh", timeout=10).stdout == "run\n"

    sb.put(src / "secret.txt", "/srv/one.txt", owner="0:65534", mode=0o640)
    assert sb.exec("stat -c '%a %u %g' /srv/one.txt", timeout=10).stdout.strip() == "640 0 65534"
    sb.put_bytes(b"bytes!", "/srv/deep/b.txt", mode=0o600)
    assert sb.read_file("/srv/deep/b.txt", max_bytes=100) == b"bytes!"
    assert sb.read_file("/srv/deep/b.txt", max_bytes=3) == b"byt"
    assert sb.read_file("/srv/none", max_bytes=3) is None

    out = tmp_path / "out"
    got = sb.get("/opt/put/here", out)
    assert got == out / "here"
    assert (got / "sub" / "data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
    assert stat.S_IMODE(os.stat(got / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(got / "secret.txt").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(got / "sub").st_mode) == 0o750
    one = sb.get("/srv/one.txt", out)
    assert one.read_text() == "s3cret"
    with pytest.raises(SandboxPathError):
        sb.get("/no/such/path", out)


def test_get_refuses_an_archive_that_escapes(sandbox_factory, tmp_path):
    sb = sandbox_factory()
    sb.exec("mkdir -p /evil/inner && echo ok > /evil/inner/fine.txt && ln -s /etc/passwd /evil/abs "
            "&& ln -s ../../.. /evil/inner/up", timeout=10)
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError):
        sb.get("/evil", dest)
    assert not dest.exists() or list(dest.iterdir()) == [], "something of a refused archive was written"
    sb.exec("rm /evil/abs", timeout=10)
    with pytest.raises(ArchiveError):  # the relative link still points out
        sb.get("/evil", dest)
    sb.exec("rm /evil/inner/up && ln -s inner/fine.txt /evil/inside", timeout=10)
    got = sb.get("/evil", dest)  # a link that stays inside is fine
    assert (got / "inside").read_text() == "ok\n"


# --- isolation and limits ------------------------------------------------------------------------------------


def test_no_route_out_when_network_is_off(sandbox_factory):
    target = _host_address()
    probe = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(3)\n"
        f"try:\n s.connect(({target!r}, 9)); print('connected')\n"
        "except OSError as e: print('errno', e.errno)\n"
    )
    sb = sandbox_factory(network=False)
    ifaces = sb.exec("ls /sys/class/net", timeout=10).stdout.split()
    assert ifaces == ["lo"]
    r = sb.exec(["python3", "-c", probe], timeout=10)
    assert r.stdout.strip() == "errno 101", r  # ENETUNREACH: no route at all


def _cgroup_value(sb, v1: str, v2: str) -> str:
    r = sb.exec(f"cat /sys/fs/cgroup/{v1} 2>/dev/null || cat /sys/fs/cgroup/{v2}", timeout=10)
    return r.stdout.strip()


def test_limits_show_in_the_cgroup(sandbox_factory, limit_applies):
    if not limit_applies("memory_mb"):
        # SPEC: LOAD-24 (issue 17 item 2): rootless podman on cgroup v1 applies no limit; refused, never dropped
        with pytest.raises(SandboxUnavailableError, match=r"cpus=0.5 cannot be applied.*memory_mb=256 cannot"):
            sandbox_factory(cpus=0.5, memory_mb=256, pids_limit=100)
        return
    sb = sandbox_factory(cpus=0.5, memory_mb=256, pids_limit=100)
    assert _cgroup_value(sb, "pids/pids.max", "pids.max") == "100"
    assert _cgroup_value(sb, "memory/memory.limit_in_bytes", "memory.max") == str(256 << 20)
    quota = sb.exec("cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null "
                    "|| cat /sys/fs/cgroup/cpu.max", timeout=10).stdout.split()
    assert int(quota[0]) / int(quota[1]) == pytest.approx(0.5)


_FORK_LOOP = """
import os, signal, time
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    print("unbounded", len(kids))
except OSError as exc:
    print("stopped", len(kids), exc.errno)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


def test_pids_limit_stops_a_fork_loop(sandbox_factory, limit_applies):
    sb = sandbox_factory(pids_limit=40)
    r = sb.exec(["python3", "-c", _FORK_LOOP], timeout=30)
    word, started, *errno = r.stdout.split()
    if not limit_applies("pids_limit"):
        # issue 17 item 2: documented as not applied there (logged once per engine), so the loop is not held
        assert word == "unbounded", r
        return
    assert word == "stopped", r
    assert 10 <= int(started) < 40 and errno == ["11"]  # EAGAIN at the cap
    assert sb.exec("echo recovered", timeout=10).stdout == "recovered\n"


def test_memory_limit_kills_an_allocation_past_it(sandbox_factory, limit_applies):
    if not limit_applies("memory_mb"):  # SPEC: LOAD-24: refused where it cannot be applied (issue 17 item 2)
        with pytest.raises(SandboxUnavailableError, match="memory_mb=64 cannot be applied"):
            sandbox_factory(memory_mb=64)
        return
    sb = sandbox_factory(memory_mb=64)
    r = sb.exec(["python3", "-c", "b = b'x' * (256 << 20); print('allocated')"], timeout=30)
    assert "allocated" not in r.stdout
    assert r.exit_code in (137, -9) or "MemoryError" in r.stderr, r
    assert sb.exec("echo still-here", timeout=10).stdout == "still-here\n"  # the sandbox itself survives


# --- leases and lifecycle -------------------------------------------------------------------------------------


def test_a_sandbox_whose_lease_is_not_renewed_disappears(sandbox_factory, settings_with, tmp_path):
    lease = leases.Lease(directory=tmp_path / "leases").start()
    sb = sandbox_factory(settings=settings_with(lease_ttl_s=3), lease=lease)
    assert sb.exec("true", timeout=10).ok
    time.sleep(4)  # renewed: still alive past its TTL
    assert sb.is_alive()
    lease.pause()
    deadline = time.monotonic() + 3 + 20  # the bound: lease_ttl_s + 20 s (GYM-10)
    while sb.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sb.is_alive(), "the sandbox outlived its unrenewed lease"
    sb.stop()


def test_stop_is_idempotent_and_context_manager_stops(sandbox_factory):
    sb = sandbox_factory()
    with sb:
        assert sb.is_alive()
    assert sb.state is SandboxState.STOPPED and not sb.is_alive()
    sb.stop()
    with pytest.raises(SandboxError):
        sb.exec("true", timeout=5)


def test_stop_from_another_thread_during_exec_raises_not_hangs(sandbox_factory):
    sb = sandbox_factory()
    threading.Timer(1.0, sb.stop).start()
    t0 = time.monotonic()
    with pytest.raises(SandboxError) as err:
        sb.exec("sleep 30", timeout=60)
    assert time.monotonic() - t0 < 10
    assert sb.name in str(err.value)
