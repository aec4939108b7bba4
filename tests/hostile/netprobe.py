"""Network probes of the hostile suite (GYM-10): host-side capture on a bridge, neighbour entries, host TCP servers,
and the in-sandbox scripts (python3 of the base image) that connect to targets or send raw frames."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Seen", "capture", "neighbour", "mac_of", "ipv4_of", "Servers", "PROBE", "reached", "RAW_UDP"]


@dataclass
class Seen:
    """Frames from one MAC that reached the host's side of a bridge: ARP with a given sender address, IPv4 with a
    given source (``ipv4``) or destination (``to``)."""

    arp: int = 0
    ipv4: int = 0
    to: int = 0


@contextmanager
def capture(bridge: str, mac: str, *, src: str | None = None, dst: str | None = None):
    """A raw socket on the host's bridge device (it sees what the bridge passes up to the host) counting frames
    from ``mac``: ARP whose sender address is ``src``, IPv4 from ``src``, IPv4 to ``dst``."""
    seen, stop = Seen(), threading.Event()
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((bridge, 0))
    sock.settimeout(0.2)
    m = bytes.fromhex(mac.replace(":", ""))
    s = socket.inet_aton(src) if src else None
    d = socket.inet_aton(dst) if dst else None

    def loop() -> None:
        while not stop.is_set():
            try:
                frame = sock.recv(2048)
            except OSError:
                continue
            if frame[6:12] != m:
                continue
            if frame[12:14] == b"\x08\x06" and s and frame[28:32] == s:
                seen.arp += 1
            elif frame[12:14] == b"\x08\x00":
                seen.ipv4 += bool(s and frame[26:30] == s)
                seen.to += bool(d and frame[30:34] == d)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        time.sleep(0.3)  # the last frames in flight
        stop.set()
        thread.join(5)
        sock.close()


def neighbour(ip: str, bridge: str) -> tuple[str | None, list[str]]:
    """The host's neighbour entry of ``ip`` on ``bridge``: (MAC, states), or (None, [])."""
    out = subprocess.run(["ip", "-j", "-4", "neigh", "show", ip, "dev", bridge], capture_output=True, text=True,
                         check=True).stdout
    entries = json.loads(out or "[]")
    return (entries[0].get("lladdr"), entries[0].get("state") or []) if entries else (None, [])


def mac_of(iface: str) -> str:
    with open(f"/sys/class/net/{iface}/address") as fh:
        return fh.read().strip()


def ipv4_of(iface: str) -> str:
    out = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", iface], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)[0]["addr_info"][0]["local"]


class Servers:
    """Host TCP servers, one thread each, that echo one line back (``bind(host, port)``; port 0 = any free)."""

    def __init__(self) -> None:
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()

    def bind(self, host: str, port: int = 0) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(32)
        sock.settimeout(0.3)
        self._socks.append(sock)
        threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
        return sock.getsockname()[1]

    def _serve(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(conn.recv(64))
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        for sock in self._socks:
            sock.close()


# argv: host:port targets. Probes all at once (a dropped SYN costs the 3 s timeout once, not per target).
PROBE = r"""
import socket, sys, threading
out = {}
def probe(t):
    host, port = t.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(port)), timeout=3)
        s.settimeout(3); s.sendall(b"hg-echo\n"); got = s.recv(64); s.close()
        out[t] = "REACHED" if got == b"hg-echo\n" else "CONNECTED"
    except OSError as exc:
        out[t] = "blocked:" + type(exc).__name__
ts = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[1:]]
[t.start() for t in ts]; [t.join() for t in ts]
for t in sys.argv[1:]:
    print(out[t], t)
"""


def reached(sb, targets: list[str]) -> list[str]:
    """The targets (``host:port``) a TCP connection from ``sb`` reached (connected at all: echoed or not)."""
    res = sb.exec(["python3", "-c", PROBE, *targets], timeout=60)
    assert res.exit_code == 0 and res.stdout.count("\n") == len(targets), res
    return [line.split()[1] for line in res.stdout.splitlines() if not line.startswith("blocked")]


# argv: iface, own MAC, gateway MAC, own IP, destination IP. Sends UDP frames to the gateway's MAC for 1.5 s.
RAW_UDP = r"""
import socket, struct, sys, time
iface, mac, gw_mac, src, dst = sys.argv[1:6]
def csum(h):
    s = sum(struct.unpack("!10H", h)); s = (s >> 16) + (s & 0xFFFF); s += s >> 16
    return ~s & 0xFFFF
payload = b"hg-raw-udp"
udp = struct.pack("!HHHH", 40001, 9, 8 + len(payload), 0) + payload
hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
frame = bytes.fromhex(gw_mac.replace(":", "")) + bytes.fromhex(mac.replace(":", "")) + b"\x08\x00" + hdr + udp
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
end, sent = time.time() + 1.5, 0
while time.time() < end:
    s.send(frame); sent += 1; time.sleep(0.1)
print("SENT", sent)
"""
