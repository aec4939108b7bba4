"""What is specific to the ``local`` backend (bubblewrap over an unpacked rootfs): isolation from the host, the
rootfs never written, refusals up front, leases, and nothing left behind. The backend-independent behaviour is the
shared contract suite (test_contract.py)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.errors import SandboxError, SandboxPathError, SandboxUnavailableError
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec, SandboxState
from harbor_gym.sandbox.lease import Lease

pytestmark = pytest.mark.bwrap

BASE = "harbor-gym/base:bookworm"


@pytest.fixture(scope="module")
def settings() -> SandboxSettings:
    return SandboxSettings.from_config(EnvConfig())


@pytest.fixture(scope="module")
def rootfs(settings) -> Path:
    return Path(settings.rootfs_aliases[BASE])


def _local(spec: SandboxSpec, settings: SandboxSettings, **kw):
    from harbor_gym.sandbox.local import LocalSandbox

    return LocalSandbox(spec, settings, **kw)


@pytest.fixture
def sandbox(settings):
    with _local(SandboxSpec(image="debian:bookworm-slim", workdir="/app", name_hint="local-test"), settings) as sb:
        yield sb


def _tree_digest(root: Path) -> str:
    """A digest of names, modes, sizes and mtimes under the top folders a sandbox would touch."""
    h = hashlib.sha256()
    for top in ("", "etc", "tmp", "root", "usr/local/bin"):
        folder = root / top
        for entry in sorted(os.listdir(folder)):
            st = os.lstat(folder / entry)
            h.update(f"{top}/{entry}:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def test_rootfs_folder_is_never_written(settings, rootfs):
    before = _tree_digest(rootfs)
    with _local(SandboxSpec(image=BASE, workdir="/app"), settings) as sb:
        r = sb.exec("echo hi > /etc/written && rm -f /etc/hostname.bak; touch /usr/local/bin/x; "
                    "mkdir -p /root/deep && rm -rf /tmp/*; cat /etc/written", timeout=10)
        assert r.exit_code == 0 and r.stdout == "hi\n"
        sb.put_bytes(b"data", "/etc/also-written")
    assert not (rootfs / "etc" / "written").exists()
    assert not (rootfs / "etc" / "also-written").exists()
    assert not (rootfs / "usr/local/bin/x").exists()
    assert _tree_digest(rootfs) == before


def test_each_sandbox_starts_pristine(settings):
    spec = SandboxSpec(image=BASE)
    with _local(spec, settings) as a:
        a.exec("echo dirty > /etc/dirt", timeout=10)
    with _local(spec, settings) as b:
        assert b.read_file("/etc/dirt", max_bytes=100) is None


def test_host_files_are_invisible(sandbox):
    # /work (this repository) and the host's harbor_gym cache exist on the host, not in the sandbox
    r = sandbox.exec("ls /work 2>&1; ls /root/.cache 2>&1; cat /proc/1/cmdline | tr '\\0' ' '; echo; ps -e | wc -l",
                     timeout=10)
    assert "No such file" in r.stdout
    assert not Path("/nonexistent-in-host").exists()
    # only the sandbox's own few processes are visible (private PID namespace)
    assert int(r.stdout.strip().splitlines()[-1]) < 10


def test_root_has_dockers_capabilities_not_sys_admin(sandbox):
    r = sandbox.exec("grep CapEff /proc/self/status; mount -t tmpfs t /mnt 2>&1; echo rc=$?", timeout=10)
    cap_eff = int(r.stdout.split()[1], 16)
    assert not cap_eff & (1 << 21)  # CAP_SYS_ADMIN
    assert cap_eff & (1 << 0)  # CAP_CHOWN
    assert "rc=0" not in r.stdout


def test_task_paths_exist(sandbox):
    r = sandbox.exec("pwd; ls -d /logs/agent /logs/verifier /logs/artifacts", timeout=10)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == "/app"


def test_cwd_is_resolved_inside_the_sandbox(sandbox):
    # /work exists only on the host: a cwd must never be opened on the host side
    with pytest.raises(SandboxPathError):
        sandbox.exec("pwd", timeout=10, cwd="/work")
    r = sandbox.exec(["pwd"], timeout=10, cwd="/logs")
    assert r.stdout == "/logs\n"


def test_user_resolved_from_sandbox_passwd(sandbox):
    sandbox.exec("useradd -m -u 4321 onlyinside && groupadd -g 4400 extra && usermod -aG extra onlyinside",
                 timeout=30)
    r = sandbox.exec("id; echo $HOME", timeout=10, user="onlyinside")
    assert "uid=4321(onlyinside)" in r.stdout and "4400(extra)" in r.stdout, r
    assert r.stdout.splitlines()[1] == "/home/onlyinside"
    with pytest.raises(SandboxError):
        sandbox.exec("id", timeout=10, user="nosuchuser")


def test_read_file_does_not_follow_links_out(sandbox):
    sandbox.exec("ln -s /etc/hostname /tmp/link; ln -s ../../../../../../etc/hostname /tmp/rel", timeout=10)
    inside = sandbox.read_file("/etc/hostname", max_bytes=100)
    assert inside == (sandbox.name[:63] + "\n").encode()
    assert sandbox.read_file("/tmp/link", max_bytes=100) == inside
    assert sandbox.read_file("/tmp/rel", max_bytes=100) == inside
    assert sandbox.read_file("/tmp/nothing", max_bytes=10) is None


def test_get_missing_raises_path_error(sandbox, tmp_path):
    with pytest.raises(SandboxPathError):
        sandbox.get("/nope", tmp_path)


def test_refuses_build_context(settings, tmp_path):
    # SPEC: LOAD-24 (what the backend cannot honour is refused up front)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(SandboxUnavailableError, match="cannot build Dockerfiles"):
        _local(SandboxSpec(build_context=tmp_path), settings).start()


def test_refuses_image_without_rootfs(settings):
    sb = _local(SandboxSpec(image="nosuch/image:1"), settings)
    with pytest.raises(SandboxUnavailableError, match="no root filesystem"):
        sb.start()
    assert sb.state is SandboxState.STOPPED


def test_refuses_gpus(settings):
    # SPEC: LOAD-24
    with pytest.raises(SandboxUnavailableError) as info:
        _local(SandboxSpec(image=BASE, gpus=1), settings).start()
    assert info.value.rule == "LOAD-24"


def test_private_network_has_only_loopback_and_public_network_its_own_namespace(settings):
    # SPEC GYM-10: every local sandbox has its own network namespace; a public one gets eth0 on the filtered bridge,
    # never the host's interfaces (tests/hostile/test_local_privilege.py checks what it cannot reach).
    with _local(SandboxSpec(image=BASE, network=False), settings) as sb:
        r = sb.exec("ls /sys/class/net; python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); "
                    "s.listen(); c=socket.create_connection(s.getsockname()); print(\"lo-ok\")'", timeout=10)
        assert r.stdout.split() == ["lo", "lo-ok"], r
    with _local(SandboxSpec(image=BASE, network=True), settings) as sb:
        inside = set(sb.exec("ls /sys/class/net", timeout=10).stdout.split())
        assert inside == {"eth0", "lo"}
        assert os.readlink(f"/proc/{sb.pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_storage_limit_bounds_the_writable_layer(settings):
    with _local(SandboxSpec(image=BASE, storage_mb=8), settings) as sb:
        r = sb.exec("dd if=/dev/zero of=/big bs=1M count=20 2>&1; echo rc=$?", timeout=30)
        assert "rc=0" not in r.stdout and "No space left" in r.stdout


def test_stop_leaves_nothing(settings):
    from harbor_gym.sandbox.local import local_root

    sb = _local(SandboxSpec(image=BASE, memory_mb=256, pids_limit=64, cpus=1.0), settings)
    sb.start()
    folder, cgroups, pid = sb.folder, sb.cgroup_dirs, sb.pid
    assert folder.is_dir() and cgroups
    sb.exec("sleep 300 & setsid sleep 301 &", timeout=10)
    sb.stop()
    sb.stop()  # idempotent
    assert not folder.exists()
    assert not any(os.path.exists(c) for c in cgroups)
    assert not os.path.exists(f"/proc/{pid}")
    assert not any(p.name == sb.name for p in local_root().iterdir()) if local_root().exists() else True
    with pytest.raises(SandboxError):
        sb.exec("true", timeout=5)


def test_lease_expiry_removes_the_sandbox(settings, tmp_path):
    # The lease rule: a sandbox whose lease is not renewed disappears by itself.
    short = SandboxSettings(
        pull_policy=settings.pull_policy, image_aliases=settings.image_aliases,
        rootfs_aliases=settings.rootfs_aliases, lease_ttl_s=1.0, output_cap_bytes=settings.output_cap_bytes,
    )
    lease = Lease(directory=tmp_path).start()
    sb = _local(SandboxSpec(image=BASE), short, lease=lease)
    sb.start()
    try:
        pid, folder = sb.pid, sb.folder
        assert sb.is_alive()
        time.sleep(2.0)
        assert sb.is_alive()  # renewed: still there after 2 TTLs
        lease.pause()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pid}")
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not folder.exists()
        assert not sb.is_alive()
    finally:
        sb.stop()
        lease.release()


def test_exec_is_cheap(sandbox):
    t0 = time.monotonic()
    for _ in range(20):
        sandbox.exec("true", timeout=10)
    per_exec = (time.monotonic() - t0) / 20
    assert per_exec < 0.05, per_exec


_TRAINER = """
import sys, time
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.local import LocalSandbox
from harbor_gym.config import host_settings
hs = host_settings()
st = SandboxSettings(image_aliases=hs.image_aliases, rootfs_aliases=hs.rootfs_aliases, lease_ttl_s=2.0)
sb = LocalSandbox(SandboxSpec(image="harbor-gym/base:bookworm", memory_mb=128), st)
sb.start()
sb.exec("sleep 1000 &", timeout=10)
print(sb.pid, sb.folder, *sb.cgroup_dirs, flush=True)
time.sleep(600)
"""


def test_trainer_killed_with_sigkill_leaves_nothing(tmp_path):
    # The lease rule: a trainer killed with SIGKILL leaves nothing running for more than a bounded time.
    import signal
    import subprocess
    import sys

    from harbor_gym.config import settings_path

    # its process lease lands in tmp_path; the host settings file stays the real one
    env = {**os.environ, "HARBOR_GYM_CACHE": str(tmp_path / "cache"), "HARBOR_GYM_SETTINGS": str(settings_path())}
    proc = subprocess.Popen([sys.executable, "-c", _TRAINER], stdout=subprocess.PIPE, env=env)
    try:
        line = proc.stdout.readline().decode().split()
        pid, folder, cgroups = int(line[0]), Path(line[1]), line[2:]
        assert os.path.exists(f"/proc/{pid}") and folder.is_dir() and cgroups
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 2.0 + 4.0  # TTL + one poll + clean-up
    while time.monotonic() < deadline and (os.path.exists(f"/proc/{pid}") or folder.exists()
                                           or any(os.path.exists(c) for c in cgroups)):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
    assert not folder.exists()
    assert not any(os.path.exists(c) for c in cgroups)


def test_gc_removes_what_a_killed_keeper_left(settings, tmp_path):
    import signal

    from harbor_gym.sandbox.local import collect_local_garbage

    short = SandboxSettings(image_aliases=settings.image_aliases, rootfs_aliases=settings.rootfs_aliases,
                            lease_ttl_s=1.0)
    lease = Lease(directory=tmp_path).start()
    sb = _local(SandboxSpec(image=BASE, pids_limit=50), short, lease=lease)
    sb.start()
    try:
        folder, cgroups, pid = sb.folder, sb.cgroup_dirs, sb.pid
        sb._keeper.send_signal(signal.SIGKILL)  # a keeper that cannot clean up (OOM killer, kill -9)
        sb._keeper.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}")  # bwrap --die-with-parent: the sandbox died with it
        assert folder.exists()
        assert sb.name not in collect_local_garbage(grace_s=0)  # its lease is still renewed: not garbage yet
        lease.pause()
        time.sleep(1.5)
        assert sb.name in collect_local_garbage(grace_s=0)
        assert not folder.exists() and not any(os.path.exists(c) for c in cgroups)
    finally:
        sb.stop()
        lease.release()
