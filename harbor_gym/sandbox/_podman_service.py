"""The supervisor of harbor_gym's own podman service (pure standard library; run as a script by `_podman`).

``python3 _podman_service.py --socket PATH --podman BINARY`` runs ``podman system service --time=0 unix://PATH`` as
its child, in the session `_podman` gave it (so a SIGKILLed trainer does not take it along), and stops it when it
is no longer needed, which is when both hold:

- no harbor_gym process uses it: each user holds a shared ``flock`` on `USERS_LOCK` beside the socket for its life
  (the kernel releases it at exit, SIGKILL included), so an exclusive non-blocking ``flock`` succeeds;
- nothing carrying the lease label (`LEASE_LABEL`) is left on the engine: the reaper container, which reaches the
  engine through this socket's folder, has removed a dead run's sandboxes (within their lease TTL + 20 s). Past
  the largest TTL label + `GIVE_UP_S` after the last user left, it stops anyway (a resource the engine cannot
  remove must not keep a service alive forever; ``harbor-gym gc`` and the next service's reaper still see it).

While it decides it holds the users lock exclusively, so a process arriving then waits, then finds the socket
dead and starts a new supervisor. It also ends when the service dies, and on SIGTERM/SIGINT (stopping the service).
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket as _socket
import subprocess
import sys
import time
import urllib.parse

USERS_LOCK = "users.lock"
START_LOCK = "start.lock"
LEASE_LABEL = "io.harbor-gym.lease"
TTL_LABEL = "io.harbor-gym.lease-ttl"
POLL_S = 2.0
GIVE_UP_S = 60.0


def podman_binary() -> str | None:
    """The ``podman`` executable on PATH, or ``None``."""
    return shutil.which("podman")


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _get(path: str, url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = _Unix(path, timeout)
    try:
        conn.request("GET", url)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def answers(path: str) -> bool:
    """True iff a service answers ``/_ping`` on the Unix socket ``path``."""
    if not os.path.exists(path):
        return False
    try:
        return _get(path, "/_ping", timeout=5.0)[0] == 200
    except OSError:
        return False


def leased_ttls(path: str) -> list[float] | None:
    """The lease TTLs of every container, network and volume carrying `LEASE_LABEL`; ``None`` if unknown."""
    query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": [LEASE_LABEL]})})
    ttls: list[float] = []
    try:
        for url, key in ((f"/v1.41/containers/json?{query}", None), (f"/v1.41/networks?{query}", None),
                         (f"/v1.41/volumes?{query}", "Volumes")):
            status, body = _get(path, url, timeout=30.0)
            if status != 200:
                return None
            items = json.loads(body or b"null")
            if key is not None:
                items = (items or {}).get(key)
            for item in items or []:
                labels = item.get("Labels") or {}
                try:
                    ttls.append(float(labels.get(TTL_LABEL, 60)))
                except ValueError:
                    ttls.append(60.0)
    except (OSError, ValueError):
        return None
    return ttls


def supervise(socket_path: str, podman: str) -> int:
    """Run the service and stop it once it is not needed (see the module docstring); returns the exit code."""
    folder = os.path.dirname(socket_path)
    users = os.open(os.path.join(folder, USERS_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    if os.path.exists(socket_path):
        os.unlink(socket_path)  # a dead service's socket (it did not answer, or we would not be here)
    child = subprocess.Popen([podman, "system", "service", "--time=0", f"unix://{socket_path}"],
                             stdin=subprocess.DEVNULL)
    stopping = []

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    alone_since: float | None = None
    try:
        while not stopping and child.poll() is None:
            time.sleep(POLL_S)
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                alone_since = None
                continue
            try:
                now = time.monotonic()
                alone_since = alone_since or now
                ttls = leased_ttls(socket_path)
                if ttls is not None and (not ttls or now - alone_since > max(ttls) + GIVE_UP_S):
                    return _stop(child, socket_path)  # still holding the lock: an arriving user waits, then restarts
            finally:
                if child.poll() is None:
                    fcntl.flock(users, fcntl.LOCK_UN)
        return _stop(child, socket_path)
    finally:
        os.close(users)


def _stop(child: subprocess.Popen, socket_path: str) -> int:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    try:
        os.unlink(socket_path)
    except OSError:
        pass
    print(f"harbor_gym podman supervisor: service stopped (exit {child.returncode})", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--podman", default="podman")
    args = parser.parse_args(argv)
    return supervise(args.socket, args.podman)


if __name__ == "__main__":
    sys.exit(main())
