"""Resource limits of local sandboxes through Linux cgroups (v2 unified, or v1 per-controller hierarchies).

`create_cgroups` makes one cgroup per sandbox (``harbor-gym/<name>`` below the hierarchy root), writes the limits and
reads them back; a limit it cannot write exactly is refused with `SandboxUnavailableError` (rule LOAD-24) and nothing
is left. Processes join by writing their pid to every returned ``cgroup.procs`` (see `join_command`). The in-sandbox
view (``/sys/fs/cgroup`` inside) is a read-only bind of the sandbox's own cgroups, laid out like Docker's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from harbor_gym.errors import SandboxUnavailableError

__all__ = ["CgroupSet", "create_cgroups", "remove_cgroups", "CGROUP_ROOT", "PARENT"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The folder below each hierarchy root that holds harbor_gym's sandbox cgroups.
PARENT = "harbor-gym"
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSet:
    """The cgroup folders of one sandbox.

    Attributes:
        dirs: every cgroup folder of the sandbox (one on v2; one per controller on v1).
        binds: (host folder, path inside the sandbox) pairs for the read-only in-sandbox view.
    """

    dirs: tuple[str, ...] = ()
    binds: tuple[tuple[str, str], ...] = field(default=())


def _v2_root() -> Path | None:
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        return CGROUP_ROOT
    return None


def _v1_dir(controller: str) -> Path | None:
    for name in (controller, f"{controller},cpuacct" if controller == "cpu" else controller, "cpu,cpuacct"):
        path = CGROUP_ROOT / name
        if (path / "cgroup.procs").is_file() and (
            controller != "cpu" or (path / "cpu.cfs_quota_us").is_file()
        ):
            return path
    return None


def _write(path: Path, value: str, *, what: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise SandboxUnavailableError(
            f"the local backend cannot enforce {what}: writing {value!r} to {path} failed ({exc}); use docker",
            field=what,
            rule="LOAD-24",
        ) from exc


def _unavailable(what: str, why: str) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"the local backend cannot enforce {what} on this host: {why}; use docker", field=what, rule="LOAD-24"
    )


def create_cgroups(name: str, *, cpus: float | None, memory_mb: int | None, pids_limit: int | None) -> CgroupSet:
    """Create the sandbox's cgroups with exactly these limits (``None`` = unlimited). No limit: no cgroup.

    Raises:
        SandboxUnavailableError: a requested limit cannot be enforced here (LOAD-24); nothing is left behind.
    """
    if cpus is None and memory_mb is None and pids_limit is None:
        return CgroupSet()
    created: list[str] = []
    try:
        if _v2_root() is not None:
            return _create_v2(name, cpus, memory_mb, pids_limit, created)
        return _create_v1(name, cpus, memory_mb, pids_limit, created)
    except BaseException:
        remove_cgroups(created)
        raise


def _create_v2(name, cpus, memory_mb, pids_limit, created) -> CgroupSet:
    root = CGROUP_ROOT
    wanted = [c for c, v in (("cpu", cpus), ("memory", memory_mb), ("pids", pids_limit)) if v is not None]
    available = (root / "cgroup.controllers").read_text().split()
    for ctrl in wanted:
        if ctrl not in available:
            raise _unavailable(f"{ctrl} limits", f"the cgroup v2 controller {ctrl!r} is not available")
    parent = root / PARENT
    parent.mkdir(exist_ok=True)
    for level in (root, parent):
        enabled = (level / "cgroup.subtree_control").read_text().split()
        missing = [c for c in wanted if c not in enabled]
        if missing:
            _write(level / "cgroup.subtree_control", " ".join("+" + c for c in missing), what="cgroup controllers")
    cg = parent / name
    cg.mkdir()
    created.append(str(cg))
    if memory_mb is not None:
        _write(cg / "memory.max", str(memory_mb * 1024 * 1024), what="memory_mb")
        if (cg / "memory.swap.max").exists():
            _write(cg / "memory.swap.max", "0", what="memory_mb")
    if pids_limit is not None:
        _write(cg / "pids.max", str(pids_limit), what="pids_limit")
    if cpus is not None:
        _write(cg / "cpu.max", f"{int(round(cpus * _CPU_PERIOD_US))} {_CPU_PERIOD_US}", what="cpus")
    return CgroupSet(dirs=(str(cg),), binds=((str(cg), "/sys/fs/cgroup"),))


def _create_v1(name, cpus, memory_mb, pids_limit, created) -> CgroupSet:
    dirs: list[str] = []
    binds: list[tuple[str, str]] = []
    for ctrl, value in (("memory", memory_mb), ("pids", pids_limit), ("cpu", cpus)):
        if value is None:
            continue
        hier = _v1_dir(ctrl)
        if hier is None:
            raise _unavailable(
                {"memory": "memory_mb", "pids": "pids_limit", "cpu": "cpus"}[ctrl],
                f"no cgroup v1 hierarchy with the {ctrl} controller under {CGROUP_ROOT}",
            )
        cg = hier / PARENT / name
        try:
            cg.mkdir(parents=True)
        except OSError as exc:
            raise _unavailable(ctrl, f"cannot create {cg} ({exc})") from exc
        created.append(str(cg))
        if ctrl == "memory":
            limit = str(memory_mb * 1024 * 1024)
            _write(cg / "memory.limit_in_bytes", limit, what="memory_mb")
            if (cg / "memory.memsw.limit_in_bytes").exists():
                _write(cg / "memory.memsw.limit_in_bytes", limit, what="memory_mb")
            if (cg / "memory.swappiness").exists():
                try:
                    (cg / "memory.swappiness").write_text("0")
                except OSError:
                    pass
        elif ctrl == "pids":
            _write(cg / "pids.max", str(pids_limit), what="pids_limit")
        else:
            _write(cg / "cpu.cfs_period_us", str(_CPU_PERIOD_US), what="cpus")
            _write(cg / "cpu.cfs_quota_us", str(int(round(cpus * _CPU_PERIOD_US))), what="cpus")
        dirs.append(str(cg))
        binds.append((str(cg), f"/sys/fs/cgroup/{hier.name}"))
    return CgroupSet(dirs=tuple(dirs), binds=tuple(binds))


def remove_cgroups(dirs, *, timeout_s: float = 5.0) -> None:
    """Kill what is left in ``dirs`` and remove them. Never raises; missing folders are fine."""
    deadline = time.monotonic() + timeout_s
    for path in dirs:
        procs = os.path.join(path, "cgroup.procs")
        while os.path.isdir(path):
            try:
                with open(procs) as fh:
                    for pid in fh.read().split():
                        try:
                            os.kill(int(pid), 9)
                        except OSError:
                            pass
                os.rmdir(path)
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
