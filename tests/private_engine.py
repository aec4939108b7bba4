"""A dockerd of a test's own: its own data root, exec root, pidfile and unix socket, no bridge, no iptables, in a
network namespace of its own, and optionally listening on ``tcp://127.0.0.1:PORT`` of the host.

Why a network namespace: a dockerd started with ``--bridge none`` deletes the host's ``docker0`` when it starts
(libnetwork's ``removeDefaultBridgeInterface``), which would break the host's engine for every other test. Why the
TCP port comes as an inherited socket (``-H fd://``, systemd's socket activation, which dockerd implements without
systemd): the ``127.0.0.1`` of a network namespace of its own is not the host's. The socket is bound on the host's
loopback by the test before dockerd starts, so the engine answers at ``tcp://127.0.0.1:PORT`` exactly as one started
with ``-H tcp://127.0.0.1:PORT`` in the host's namespace would.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

__all__ = ["PrivateEngine", "free_port"]


def free_port() -> int:
    """A TCP port free on the host's loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateEngine:
    """A dockerd of our own under ``root`` (a short path: unix sockets are limited to 108 bytes).

    Attributes:
        sock: its unix socket's URL (``unix://ROOT/docker.sock``): the path its reaper mounts.
        url: ``tcp://127.0.0.1:PORT`` when started with a TCP port, else `sock`.
    """

    def __init__(self, root: Path | None = None, *, tcp_port: int | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="hg-eng-", dir="/tmp"))
        self.sock = f"unix://{self.root}/docker.sock"
        self.socket_path = f"{self.root}/docker.sock"
        self.tcp_port = tcp_port
        self.url = f"tcp://127.0.0.1:{tcp_port}" if tcp_port else self.sock
        self.pidfile = self.root / "docker.pid"
        self.log = self.root / "dockerd.log"

    def start(self, wait_s: float = 60) -> None:
        import docker

        args = ["unshare", "--net", "dockerd", "--host", self.sock, "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"), "--pidfile", str(self.pidfile), "--bridge", "none",
                "--iptables=false", "--ip-masq=false"]
        listener = None
        preexec: "Callable[[], None] | None" = None
        if self.tcp_port:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.tcp_port))
            listener.listen(64)
            args += ["--host", "fd://"]
            fd = listener.fileno()

            def as_fd3() -> None:  # in the child: the listener as fd 3, named for dockerd (LISTEN_PID = its pid)
                os.dup2(fd, 3)
                os.environ["LISTEN_FDS"] = "1"
                os.environ["LISTEN_PID"] = str(os.getpid())

            preexec = as_fd3

        with open(self.log, "a") as log:
            subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=preexec, pass_fds=(3,) if listener else ())
        if listener is not None:
            listener.close()
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                client = docker.DockerClient(base_url=self.url, version="1.41", timeout=5)
                client.ping()
                client.close()
                return
            except Exception:  # not up yet
                time.sleep(0.2)
        raise RuntimeError(f"private dockerd did not come up: {self.log.read_text()[-2000:]}")

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text())
        except (OSError, ValueError):
            return None

    def stop(self, wait_s: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``wait_s``."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def kill(self) -> None:
        """An engine that stops answering at once, as when its host dies: SIGKILL dockerd, its containerd and
        shims, and every container's processes (each container's init first: its PID namespace goes with it)."""
        inits = []
        try:
            client = self.client(timeout=5)
            try:
                inits = [int(client.api.inspect_container(c["Id"])["State"]["Pid"] or 0)
                         for c in client.api.containers()]
            finally:
                client.close()
        except Exception:  # already not answering: its shims still go below
            pass
        found = subprocess.run(["pgrep", "-f", str(self.root)], capture_output=True, text=True).stdout.split()
        pid = self.pid()
        for p in [*([pid] if pid else []), *map(int, found), *[i for i in inits if i > 0]]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 10
        while pid and time.monotonic() < end:
            try:
                os.kill(pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        try:
            self.pidfile.unlink()
        except OSError:
            pass

    def client(self, timeout: int = 30):
        import docker

        return docker.DockerClient(base_url=self.url, version="1.41", timeout=timeout)

    def load_image(self, source, ref: str) -> None:
        """Copy image ``ref`` from the SDK client ``source`` into this engine (save/load: no registry here)."""
        client = self.client(timeout=300)
        try:
            client.images.load(b"".join(source.images.get(ref).save(named=True)))
        finally:
            client.close()

    def remove(self) -> None:
        """Kill it with everything it ran (`kill`: no graceful stop to wait for), unmount whatever is mounted under
        its folder (container layers, network namespaces), deepest first, and delete the folder."""
        self.kill()
        prefix = f"{self.root}/"
        with open("/proc/mounts") as table:
            mounts = [line.split()[1] for line in table if line.split()[1].startswith(prefix)]
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
