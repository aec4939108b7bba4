"""GYM-10, mechanical: after the hostile suite (this module is collected last in tests/hostile/), a scan of the
host's own folders (`SCANNED`) finds no file newer than the session's stamp outside the run's folders and scratch.

Left out of the scan, each for a stated reason: pseudo and runtime filesystems (``/proc``, ``/sys``, ``/dev``,
``/run``); scratch (``/tmp``, ``/var/tmp``: pytest's folders, local sandboxes' layers, temporary log folders);
the engines' data roots (``/var/lib/docker``, ``/var/lib/containerd``, ``/var/lib/harbor-gym``, podman's
``/var/lib/containers``) and podman's network definitions (``/etc/containers/networks``, which netavark writes
when harbor_gym creates its podman network, the first time on a new machine); logs and package
caches (``/var/log``, ``/var/cache``, ``/root/.cache``: pip caches and harbor_gym's lease folder); the working
trees (``/work``: the repository and its notes, edited by people at the same time); Python bytecode caches.
Other filesystems than ``/`` are not crossed (``-xdev``).
"""

from __future__ import annotations

import os
import subprocess

#: The host's own folders (the Filesystem Hierarchy Standard's, plus the root's home): where a file escaping a sandbox
#: would land. Folders of the machine's operator outside these (a CI harness's output folder) are not scanned.
SCANNED = ("/etc", "/usr", "/var", "/root", "/home", "/opt", "/srv", "/mnt", "/media", "/boot", "/bin", "/sbin",
           "/lib", "/lib64", "/lib32", "/libx32")
PRUNED = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/var/lib/docker", "/var/lib/containerd",
          "/var/lib/harbor-gym", "/var/lib/containers", "/etc/containers/networks", "/var/log", "/var/cache",
          "/root/.cache", "/work")


def new_files(stamp) -> list[str]:
    """Files and links on ``/`` newer than ``stamp``, outside `PRUNED` and ``__pycache__`` folders."""
    prune: list[str] = []
    for path in PRUNED:
        prune += ["-path", path, "-o"]
    roots = [root for root in SCANNED if os.path.isdir(root) and not os.path.islink(root)]
    cmd = ["find", *roots, "-xdev", "(", *prune, "-name", "__pycache__", ")", "-prune", "-o",
           "(", "-type", "f", "-o", "-type", "l", ")", "-newer", str(stamp), "-print"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return sorted(line for line in out.stdout.splitlines() if line and not line.endswith(".pyc"))


# SPEC: GYM-10 (no file appeared on the host outside the run's folders and scratch during the hostile suite)
def test_gym_10_no_new_host_file_after_the_hostile_suite(host_scan_stamp):
    found = new_files(host_scan_stamp)
    assert found == [], f"new host files since the hostile suite started: {found[:50]}"
