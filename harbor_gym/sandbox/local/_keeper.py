"""The keeper of one local sandbox: a standalone host script (stdlib only, run as ``python3 -I -S _keeper.py CFG``).

It is started by `LocalSandbox.start` inside a private mount namespace (``unshare --mount --propagation private``)
and owns everything of its sandbox:

1. mounts the writable layer (with ``storage_mb``: a loop-mounted ext4 image of that size, else a tmpfs of that size
   where no loop device can be had; without: a folder on the temp root's filesystem) and an overlayfs of the
   read-only root filesystem + that layer — in its own mount namespace only, so the mounts vanish with the namespace
   (the loop device with them) and the root filesystem folder is never written;
2. starts bubblewrap on the merged tree (private PID/IPC/UTS namespaces; the keeper already runs in the sandbox's
   own network namespace), through the host's ``/bin/sh`` when the bwrap process must first join the sandbox's
   cgroups, with the sandbox's seccomp filter (``cfg["seccomp"]``, hex of the BPF program ``_seccomp.py`` built;
   ``bwrap --seccomp``), which bubblewrap installs in the sandbox's PID 1 and in the command it starts, so every
   process of the sandbox is filtered. Without a filter in ``cfg`` the sandbox is not started (GYM-10);
3. reports ``{"pid": <host pid of the sandbox's PID 1>}`` as one JSON line on stdout;
4. watches the lease file: when its mtime is older than the lease TTL (the host stopped renewing it: the trainer
   died), or on SIGTERM/SIGINT, or when bwrap ends, it kills the sandbox (its PID namespace dies with PID 1),
   unmounts, removes the cgroups and the sandbox's folder, and exits. So a sandbox never outlives its lease by more
   than one poll interval (lease rule of the issue; ``harbor-gym gc`` handles what a SIGKILLed keeper leaves).

It imports nothing of harbor_gym so that it starts in ~20 ms and keeps working when the trainer is gone.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
_PR_SET_CHILD_SUBREAPER = 36
#: The environment of the sandbox's PID 1 (bwrap): a PATH only.
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise _Stop()


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC = 1, 2, 4, 8, 4096, 16384


def _mount(source, target, fstype, options, flags=0):
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, options.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t {fstype} {source} {target} -o {options}: {os.strerror(err)}")


def _umount(target):
    _libc.umount2(target.encode(), _MNT_DETACH)


def _fail(message):
    sys.stdout.write(json.dumps({"error": message}) + "\n")
    sys.stdout.flush()


def _mount_disk_image(cfg, layer):
    """A sparse file of ``storage_mb`` MiB holding a fresh journal-less ext4, loop-mounted on ``layer``.

    GYM-10: the filesystem itself bounds the writable layer (``dd`` and ``fallocate`` alike get ENOSPC at the size),
    the host disk grows by at most that size (deleted files are discarded back to holes), and nothing of it counts
    against host memory. The loop device is released when the mount goes (autoclear), also when this keeper's mount
    namespace dies with it after a SIGKILL.
    """
    image = os.path.join(cfg["dir"], "layer.img")
    with open(image, "wb") as fh:
        fh.truncate(int(cfg["storage_mb"]) * 1024 * 1024)
    mkfs = subprocess.run(
        [shutil.which("mkfs.ext4") or "/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
         "-E", "lazy_itable_init=1,nodiscard", image],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    if mkfs.returncode != 0:
        raise OSError("mkfs.ext4 failed: %s" % mkfs.stdout.decode(errors="replace").strip()[-500:])
    mount = subprocess.run(
        [shutil.which("mount") or "/bin/mount", "-t", "ext4", "-o", "loop,noinit_itable,discard", image, layer],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    if mount.returncode != 0:
        raise OSError("loop mount failed: %s" % mount.stdout.decode(errors="replace").strip()[-500:])


def _mount_layer(cfg):
    """Mount the writable layer and the overlay; returns the merged folder.

    With ``storage_mb``: a loop-mounted ext4 image of that size (`_mount_disk_image`), else (no loop devices here)
    a tmpfs of that size, which counts against host memory and the sandbox's memory limit. Without: a folder on the
    temp root's filesystem, else an unbounded tmpfs. ``cfg["layer_kind"]`` says which one was used.
    """
    base = cfg["dir"]
    layer = os.path.join(base, "layer")
    merged = os.path.join(base, "merged")
    os.makedirs(layer, exist_ok=True)
    os.makedirs(merged, exist_ok=True)
    attempts = ["disk-image", "tmpfs"] if cfg["storage_mb"] else ["disk", "tmpfs"]
    errors = []
    for kind in attempts:
        try:
            if kind == "disk-image":
                _mount_disk_image(cfg, layer)
            elif kind == "tmpfs":
                opts = "mode=0755"
                if cfg["storage_mb"]:
                    opts += ",size=%dm" % int(cfg["storage_mb"])
                _mount("tmpfs", layer, "tmpfs", opts)
            upper = os.path.join(layer, "upper")
            work = os.path.join(layer, "work")
            os.makedirs(upper, exist_ok=True)
            os.makedirs(work, exist_ok=True)
            os.chmod(upper, 0o755)
            _mount("overlay", merged, "overlay", "lowerdir=%s,upperdir=%s,workdir=%s" % (cfg["lower"], upper, work))
            cfg["layer_kind"] = kind
            return merged
        except OSError as exc:
            errors.append("%s layer: %s" % (kind, exc))
            if kind != "disk":
                _umount(layer)
            try:
                os.unlink(os.path.join(base, "layer.img"))
            except OSError:
                pass
    raise OSError("cannot mount the sandbox's overlay (" + "; ".join(errors) + ")")


def _loopback_up():
    """Bring ``lo`` up in this (fresh) network namespace: SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifr = fcntl.ioctl(sock, 0x8913, struct.pack("16sH14x", b"lo", 0))
        flags = struct.unpack("16sH14x", ifr)[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))


def _mount_sys(cfg):
    """A fresh read-only sysfs (it shows this network namespace's interfaces: only ``lo`` when the network is
    off) with the sandbox's own cgroups at ``fs/cgroup``, laid out like Docker's; bound to /sys by bwrap."""
    sys_dir = os.path.join(cfg["dir"], "sys")
    os.makedirs(sys_dir, exist_ok=True)
    _mount("sysfs", sys_dir, "sysfs", "", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    firmware = os.path.join(sys_dir, "firmware")
    if os.path.isdir(firmware):  # masked, as Docker masks it (the host's firmware tables)
        _mount("tmpfs", firmware, "tmpfs", "size=4k,mode=0755", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    binds = cfg["cgroup_binds"]
    cg_dir = os.path.join(sys_dir, "fs", "cgroup")
    if binds and os.path.isdir(cg_dir):
        if len(binds) == 1 and binds[0][1] == "/sys/fs/cgroup":  # v2: the sandbox's cgroup is the whole tree
            _mount(binds[0][0], cg_dir, "", "", _MS_BIND)
        else:
            _mount("tmpfs", cg_dir, "tmpfs", "mode=0755,size=64k", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            for host, inside in binds:
                target = os.path.join(cg_dir, os.path.basename(inside))
                os.makedirs(target, exist_ok=True)
                _mount(host, target, "", "", _MS_BIND)
    return sys_dir


def _remove_cgroups(paths, deadline):
    for path in paths:
        while True:
            try:
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    pids = [int(p) for p in fh.read().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


def _read_log(fd, cap=2000):
    """What the pipe ``fd`` holds now (non-blocking), its last ``cap`` bytes decoded; the rest is dropped."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        data = (data + chunk)[-cap:]
    return data.decode(errors="replace")


def _reap_all(deadline):
    """Wait for every child and re-parented orphan (the sandbox's PID 1 dies with its namespace)."""
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def main():
    cfg = json.loads(sys.argv[1])
    try:
        bpf = bytes.fromhex(cfg.get("seccomp") or "")
    except ValueError:
        bpf = b""
    if not bpf or len(bpf) % 8:  # before anything is mounted or started: a sandbox never runs unfiltered (GYM-10)
        _fail("refused: no seccomp filter for the sandbox (GYM-10)")
        return 3
    # A fresh session keyring for the keeper and so for bwrap and the sandbox's PID 1: not the trainer's.
    sys_keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if sys_keyctl is not None:
        _libc.syscall(sys_keyctl, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    # Orphans of bwrap (its PID 1 once bwrap is killed) are re-parented here and reaped before we exit.
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    proc = None
    merged = None
    try:
        try:
            merged = _mount_layer(cfg)
        except OSError as exc:
            _fail(str(exc))
            return 3
        try:
            if cfg["private_net"]:
                _loopback_up()
            sys_dir = _mount_sys(cfg)
        except OSError as exc:
            _fail("cannot set up the sandbox's network or /sys: %s" % exc)
            return 3
        for rel in cfg["dirs"]:
            # Created through bwrap --dir would follow the rootfs's own symlinks inside the new root; here we only
            # make plain folders below the merged tree, never following a symlink out of it.
            path = merged
            for part in [p for p in rel.split("/") if p]:
                path = os.path.join(path, part)
                if os.path.islink(path):
                    break
                if not os.path.isdir(path):
                    os.mkdir(path, 0o755)
        seccomp_fd = os.memfd_create("harbor-gym-seccomp", 0)
        os.write(seccomp_fd, bpf)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        info_r, info_w = os.pipe()
        fds = [info_w, seccomp_fd]
        argv = list(cfg["prefix"]) + ["--bind", merged, "/", "--ro-bind", sys_dir, "/sys"]
        for dest, data in cfg["files"].items():
            r, w = os.pipe()
            os.write(w, data.encode())
            os.close(w)
            fds.append(r)
            argv += ["--bind-data", str(r), dest]
        argv += ["--info-fd", str(info_w), "--seccomp", str(seccomp_fd)] + list(cfg["args"])
        # bwrap's stderr (inherited by the sandbox's PID 1 and what it starts) is a pipe this keeper drains, never
        # a host file: a root agent can reopen it through /proc/1/fd/2, and a file would grow without bound.
        log_r, log_w = os.pipe()
        os.set_blocking(log_r, False)
        # bwrap becomes the sandbox's PID 1, whose /proc/1/environ every sandbox process can read: it starts
        # with a PATH only, never this host's environment (API keys, cloud credentials, HOME).
        proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=log_w, env={"PATH": _SANDBOX_PATH})
        os.close(log_w)
        for fd in fds:
            os.close(fd)
        with os.fdopen(info_r, "rb") as fh:
            raw = fh.read()  # bwrap closes the info fd once the sandbox is set up
        try:
            pid = int(json.loads(raw.decode())["child-pid"])
        except (ValueError, KeyError):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            log = _read_log(log_r)
            _fail("bubblewrap did not start the sandbox: " + (log.strip() or "no output"))
            return 3
        # bwrap reports its child before it has set up the new root: wait until that child's root is ours.
        want = os.stat(merged)
        deadline = time.monotonic() + 20
        while True:
            try:
                st = os.stat("/proc/%d/root/" % pid)
                if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log = _read_log(log_r)
                _fail("bubblewrap did not set up the sandbox's root: " + (log.strip() or "no output"))
                return 3
            time.sleep(0.002)
        sys.stdout.write(json.dumps({"pid": pid, "layer": cfg.get("layer_kind")}) + "\n")
        sys.stdout.flush()
        lease = cfg["lease"]
        ttl = float(cfg["ttl"])
        interval = max(0.05, min(1.0, ttl / 10.0))
        while proc.poll() is None:
            try:
                age = time.time() - os.stat(lease).st_mtime
            except FileNotFoundError:
                break
            if age > ttl:
                break
            _read_log(log_r)  # drop what the sandbox's PID 1 or its heirs write to their stderr
            time.sleep(interval)
        return 0
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if proc is not None and proc.poll() is None:
            proc.kill()  # bwrap --die-with-parent: its PID 1 and therefore the whole PID namespace die with it
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        _reap_all(deadline)
        _remove_cgroups(cfg["cgroups"], deadline)
        _umount(os.path.join(cfg["dir"], "sys"))  # detaches sysfs and the cgroup view below it
        if merged is not None:
            _umount(merged)
            _umount(os.path.join(cfg["dir"], "layer"))
        shutil.rmtree(cfg["dir"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
