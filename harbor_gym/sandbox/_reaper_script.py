"""The engine-side reaper's program (pure standard library; runs as ``python3`` inside the reaper container).

Uploaded verbatim into the container ``harbor-gym-reaper`` by `harbor_gym.sandbox._reaper` and run there as its
main process. It speaks the Docker engine API over the mounted socket (``http.client`` on a Unix socket) and, every
`POLL_S` seconds, removes every container, network and volume that carries `LEASE_LABEL` and is reaped by it
(`REAPED_BY_LABEL` names this reaper: a reaper of another harbor_gym version holds other leases) and whose lease is
stale.

A lease is the file ``/leases/<run_id>`` in this container, rewritten (``put_archive``) by the trainer process that
owns the run every few seconds. Its age is measured by the file's ``st_ctime``: set by this container's kernel when
the file is written, so the trainer's clock (perhaps another host's) never matters. A resource is stale when

- its lease file says ``released`` (the process ended; whatever is left is garbage), or
- ``now - last renewal > ttl + LATENCY_S``, where ttl is the resource's `TTL_LABEL` (default 60 s) and the last
  renewal is the lease file's ctime, or, when there is no lease file (the reaper was replaced and lost its leases,
  or the renewal never arrived), the later of the reaper's start and the resource's creation (a grace of one ttl).
  `LATENCY_S` (10 s) allows for a loaded engine: a renewal is an archive upload, which a busy engine has been seen
  to take 9 s to apply. With the poll interval and the removal, the bound stays within ``ttl`` + 20 s.
  On an engine slower than that the allowance grows: a probe thread uploads a small archive into this container
  (the very operation a renewal is) every `PROBE_S`, and twice the slowest upload of the last `PROBE_WINDOW_S`
  (an upload still in flight counts with its age so far) is added. An overloaded engine thus delays removal
  rather than removing the sandbox of a live run whose renewals it has not applied yet.

Nothing inside a sandbox takes part: a sandbox cannot reach this container (it has no network) nor the engine.
The module is importable on the host for unit tests of `is_stale` (nothing runs at import).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from datetime import datetime

LEASE_LABEL = "io.harbor-gym.lease"
#: The reaper (container name) a resource's lease is renewed into; each reaper removes only its own resources.
REAPED_BY_LABEL = "io.harbor-gym.reaped-by"
#: This reaper's container name (given by whoever created it).
NAME = os.environ.get("HARBOR_GYM_REAPER_NAME", "")
TTL_LABEL = "io.harbor-gym.lease-ttl"
DEFAULT_TTL_S = 60.0
LEASES = "/leases"
STARTED = "/reaper-started"
#: The engine's socket inside this container (podman's is mounted with its folder, so a restarted service is seen).
SOCKET = os.environ.get("HARBOR_GYM_REAPER_ENGINE_SOCKET", "/var/run/docker.sock")
POLL_S = float(os.environ.get("HARBOR_GYM_REAPER_POLL_S", "2"))
#: Allowance for a renewal delayed by a loaded engine (see the module docstring).
LATENCY_S = 10.0
#: How often the probe measures the engine's archive upload latency, and over which window its slowest counts.
PROBE_S = 5.0
PROBE_WINDOW_S = 120.0
#: Lease files not rewritten for this long are deleted (their runs ended long ago).
FORGET_S = 86400.0
RELEASED = b"released"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 60.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def call(method: str, path: str, query: dict | None = None, timeout: float = 120.0) -> tuple[int, bytes]:
    """One engine API request; returns (status, body)."""
    if query:
        path = f"{path}?{urllib.parse.urlencode(query)}"
    conn = _UnixConnection(SOCKET, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def parse_time(text: str) -> float:
    """An engine RFC 3339 timestamp (nanoseconds allowed) as a Unix time; 0.0 when unreadable."""
    try:
        text = re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00")
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, AttributeError):
        return 0.0


def ttl_of(labels: dict) -> float:
    """The resource's lease TTL (its `TTL_LABEL`, else `DEFAULT_TTL_S`)."""
    try:
        ttl = float(labels.get(TTL_LABEL, DEFAULT_TTL_S))
    except (TypeError, ValueError):
        return DEFAULT_TTL_S
    return ttl if ttl > 0 else DEFAULT_TTL_S


def lease_state(run_id: str, leases: str = LEASES) -> tuple[str, float]:
    """("missing", 0) | ("released", ctime) | ("renewed", ctime) for the run's lease file."""
    if not _RUN_ID.match(run_id or ""):
        return "missing", 0.0
    path = os.path.join(leases, run_id)
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            ctime = os.fstat(fh.fileno()).st_ctime
    except OSError:
        return "missing", 0.0
    return ("released" if head.strip() == RELEASED else "renewed"), ctime


def is_stale(state: tuple[str, float], *, ttl: float, created: float, started: float, now: float,
             engine_lag: float = 0.0) -> bool:
    """True iff a resource whose lease is in ``state`` is garbage at ``now`` (see the module docstring);
    ``engine_lag`` is the slowest recent archive upload (`Probe.lag`)."""
    kind, renewed = state
    if kind == "released":
        return True
    last = renewed if kind == "renewed" else max(started, created)
    return now - last > ttl + LATENCY_S + 2 * max(0.0, engine_lag)


class Probe:
    """Measures how long the engine takes to apply an archive upload into this container (a renewal's path)."""

    def __init__(self) -> None:
        self._samples: list[tuple[float, float]] = []  # (start, duration)
        self._in_flight: float | None = None

    def record(self, start: float, duration: float) -> None:
        self._samples.append((start, duration))
        cutoff = start - PROBE_WINDOW_S
        self._samples = [(t, d) for t, d in self._samples if t >= cutoff]

    def lag(self, now: float) -> float:
        """The slowest upload of the window, or the age of the one in flight if longer."""
        slowest = max((d for t, d in self._samples if t >= now - PROBE_WINDOW_S), default=0.0)
        in_flight = self._in_flight
        return max(slowest, now - in_flight if in_flight is not None else 0.0)

    def run(self) -> None:
        """Upload a tiny archive every `PROBE_S` forever (in a daemon thread)."""
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("probe")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"p\n"))
        body = buf.getvalue()
        while True:
            start = time.time()
            self._in_flight = start
            try:
                conn = _UnixConnection(SOCKET, timeout=600.0)
                try:
                    conn.request("PUT", f"/containers/{NAME}/archive?path=/tmp", body=body,
                                 headers={"Content-Type": "application/x-tar"})
                    conn.getresponse().read()
                finally:
                    conn.close()
            except Exception as exc:  # counted by its duration all the same
                print(f"reaper: probe failed: {exc!r}", file=sys.stderr, flush=True)
            self._in_flight = None
            self.record(start, time.time() - start)
            time.sleep(PROBE_S)


def _resources() -> list[tuple[str, str, str, dict, float]]:
    """(kind, id, name, labels, created) of every labelled container, network and volume."""
    filters = json.dumps({"label": [LEASE_LABEL, f"{REAPED_BY_LABEL}={NAME}"]})
    out: list[tuple[str, str, str, dict, float]] = []
    status, body = call("GET", "/containers/json", {"all": "1", "filters": filters})
    if status == 200:
        for c in json.loads(body):
            out.append(("container", c["Id"], (c.get("Names") or [c["Id"]])[0].lstrip("/"), c.get("Labels") or {},
                        float(c.get("Created") or 0)))
    status, body = call("GET", "/networks", {"filters": filters})
    if status == 200:
        for n in json.loads(body):
            out.append(("network", n["Id"], n.get("Name", n["Id"]), n.get("Labels") or {},
                        parse_time(n.get("Created", ""))))
    status, body = call("GET", "/volumes", {"filters": filters})
    if status == 200:
        for v in json.loads(body).get("Volumes") or []:
            out.append(("volume", v["Name"], v["Name"], v.get("Labels") or {}, parse_time(v.get("CreatedAt", ""))))
    return out


def _remove(kind: str, ident: str) -> int:
    if kind == "container":
        return call("DELETE", f"/containers/{ident}", {"force": "1", "v": "1"}, timeout=REMOVE_TIMEOUT_S)[0]
    if kind == "network":
        return call("DELETE", f"/networks/{ident}", timeout=REMOVE_TIMEOUT_S)[0]
    return call("DELETE", f"/volumes/{ident}", {"force": "1"}, timeout=REMOVE_TIMEOUT_S)[0]


#: Removals under way (a loaded engine can take minutes to remove one container; the pass does not wait for them).
_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()
REMOVE_TIMEOUT_S = 900.0


def _remove_in_background(kind: str, ident: str, name: str) -> bool:
    """Start removing one resource in a daemon thread; False if its removal is already under way."""
    with _in_flight_lock:
        if ident in _in_flight:
            return False
        _in_flight.add(ident)

    def work() -> None:
        try:
            status = _remove(kind, ident)
            if status < 300 or status == 404:
                print(f"reaper: removed {kind} {name} (lease stale)", flush=True)
            elif status != 409:  # 409: already being removed
                print(f"reaper: removing {kind} {name} answered {status}; retried next pass", file=sys.stderr,
                      flush=True)
        except Exception as exc:  # retried at a later pass
            print(f"reaper: removing {kind} {name} failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            with _in_flight_lock:
                _in_flight.discard(ident)

    threading.Thread(target=work, name=f"remove-{name}", daemon=True).start()
    return True


def reap_once(started: float, now: float | None = None, probe: Probe | None = None) -> list[str]:
    """One pass: start removing every stale labelled resource (containers first, then networks and volumes, which
    the engine refuses while a container still uses them; the next pass retries), each in its own thread so that a
    slow removal never holds up the others. Returns what it started removing."""
    now = time.time() if now is None else now
    lag = probe.lag(time.time()) if probe is not None else 0.0
    removed = []
    order = {"container": 0, "network": 1, "volume": 2}
    for kind, ident, name, labels, created in sorted(_resources(), key=lambda r: order[r[0]]):
        state = lease_state(labels.get(LEASE_LABEL, ""))
        if not is_stale(state, ttl=ttl_of(labels), created=created, started=started, now=now, engine_lag=lag):
            continue
        if _remove_in_background(kind, ident, name):
            removed.append(f"{kind} {name}")
    return removed


def _forget_old_leases(now: float) -> None:
    try:
        names = os.listdir(LEASES)
    except OSError:
        return
    for name in names:
        path = os.path.join(LEASES, name)
        try:
            if now - os.stat(path).st_ctime > FORGET_S:
                os.unlink(path)
        except OSError:
            pass


def reaches_own_engine() -> str:
    """"" if the socket reaches the engine this container runs on (it knows this container: the hostname is the
    container's short id, which the engine gave it), else why not. A socket that reaches another engine (a misnamed
    ``EnvConfig.engine_sockets``) would judge that engine's live resources by these leases, so it never reaps."""
    me = socket.gethostname()
    try:
        status, body = call("GET", f"/containers/{urllib.parse.quote(me)}/json", timeout=30)
    except Exception as exc:  # no engine there
        return f"{SOCKET} reaches no engine ({exc!r})"
    if status == 200 and str(json.loads(body).get("Id", "")).startswith(me):
        return ""
    return f"the engine at {SOCKET} does not know this container ({me}): it is another engine"


def main() -> None:
    """Reap forever. The start time is kept in `STARTED` (first start of this container: a restart by the engine
    keeps the lease files, so the grace for lease-less resources counts from the container's first start)."""
    os.makedirs(LEASES, exist_ok=True)
    while True:
        wrong = reaches_own_engine()
        if not wrong:
            break
        print(f"reaper: not reaping: {wrong}", file=sys.stderr, flush=True)
        time.sleep(30)
    try:
        started = float(open(STARTED).read())
    except (OSError, ValueError):
        started = time.time()
        with open(STARTED, "w") as fh:
            fh.write(repr(started))
    print(f"reaper: watching label {LEASE_LABEL} every {POLL_S:g} s", flush=True)
    probe = Probe()
    threading.Thread(target=probe.run, name="probe", daemon=True).start()
    passes = 0
    while True:
        try:
            reap_once(started, probe=probe)
        except Exception as exc:  # the engine restarting, a slow answer: keep going
            print(f"reaper: pass failed: {exc!r}", file=sys.stderr, flush=True)
        passes += 1
        if passes % 600 == 0:
            _forget_old_leases(time.time())
        time.sleep(POLL_S)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check-engine"]:
        print(reaches_own_engine() or "ok")
    else:
        main()
