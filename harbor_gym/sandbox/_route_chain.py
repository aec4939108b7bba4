"""The host firewall chain that admits sandboxes to one host service's port (`harbor_gym.sandbox.host_route`).

``HG-HOST-ROUTE`` exists in the ``filter`` and ``mangle`` tables (mangle: the local backend drops its bridge's
traffic to the host there too, before the filter table). It is jumped to first in ``INPUT``, above every drop of
harbor_gym's bridges (`harbor_gym.sandbox._netfilter`, `harbor_gym.sandbox.local._net`), and holds only ACCEPTs of
TCP to one port on one bridge's own address; whatever it does not accept falls through to those drops. Both
modules that insert drops call `ensure_first` after, so a drop inserted later never hides a route (and a route can
only ever make the drops' exceptions, never widen anything else). An empty chain changes nothing.
"""

from __future__ import annotations

import subprocess

__all__ = ["CHAIN", "ensure_first"]

#: The route chain's name (filter and mangle tables).
CHAIN = "HG-HOST-ROUTE"
_TIMEOUT_S = 30.0


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def ensure_first(iptables: str, table: str) -> str | None:
    """Create `CHAIN` in ``table`` if missing and make ``INPUT -j CHAIN`` the first rule of ``INPUT``.

    Returns:
        ``None`` on success, else the complaint of the failing command.
    """
    wait = [iptables, "-w", "10", "-t", table]
    if _run([*wait, "-n", "-L", CHAIN]).returncode != 0:
        made = _run([*wait, "-N", CHAIN])
        if made.returncode != 0 and _run([*wait, "-n", "-L", CHAIN]).returncode != 0:  # lost a race: fine
            return made.stderr.strip()[-300:] or "iptables -N failed"
    listed = _run([*wait, "-S", "INPUT"])
    if listed.returncode != 0:
        return listed.stderr.strip()[-300:] or "iptables -S failed"
    rules = [line for line in listed.stdout.splitlines() if line.startswith("-A INPUT")]
    jump = f"-A INPUT -j {CHAIN}"
    if rules and rules[0] == jump:
        return None
    for _ in range(rules.count(jump)):
        _run([*wait, "-D", "INPUT", "-j", CHAIN])
    inserted = _run([*wait, "-I", "INPUT", "1", "-j", CHAIN])
    return None if inserted.returncode == 0 else (inserted.stderr.strip()[-300:] or "iptables -I failed")
