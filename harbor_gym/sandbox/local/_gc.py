"""Garbage collection of local sandboxes that crashed runs left behind (used by ``harbor-gym gc``).

A live keeper removes its sandbox itself when the lease goes stale, so what is left here is only what a keeper
killed with SIGKILL (or a host crash) left: a folder under `local_root()` and maybe cgroups named in its meta file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from harbor_gym.sandbox.local._cgroups import remove_cgroups

__all__ = ["collect_local_garbage"]

#: Extra time past the lease TTL before a folder counts as abandoned (its keeper may be cleaning up).
_GRACE_S = 30.0


def _keeper_pids(folder: Path) -> list[int]:
    pids = []
    needle = str(folder).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if b"_keeper.py" in cmdline and needle in cmdline:
            pids.append(int(entry))
    return pids


def collect_local_garbage(*, root: Path | None = None, grace_s: float = _GRACE_S) -> list[str]:
    """Remove every local sandbox folder whose lease is older than its TTL + ``grace_s``; returns their names.

    Kills a keeper still running for such a folder, removes the cgroups its meta file names, then the folder.
    Never touches a sandbox whose lease is fresh.
    """
    from harbor_gym.sandbox.local.sandbox import local_root

    base = root or local_root()
    removed: list[str] = []
    if not base.is_dir():
        return removed
    now = time.time()
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        ttl = float(meta.get("ttl", 60.0))
        try:
            age = now - Path(meta["lease"]).stat().st_mtime
        except (OSError, KeyError):  # no lease file: the run released it or died long ago
            try:
                age = now - folder.stat().st_mtime
            except OSError:
                continue
        if age <= ttl + grace_s:
            continue
        for pid in _keeper_pids(folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        remove_cgroups(meta.get("cgroups", []))
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder.name)
    _release_stale_addresses()
    return removed


def _release_stale_addresses() -> None:
    """Remove the network address leases (``_net.LEASE_DIR``) whose sandbox folder is gone."""
    from harbor_gym.sandbox.local._net import LEASE_DIR

    try:
        entries = list(LEASE_DIR.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            holder = Path(entry.read_text())
        except OSError:
            continue
        if not holder.exists():
            entry.unlink(missing_ok=True)
