"""Cost of the local backend's seccomp filter per exec: Docker's default profile against an allow-all filter.

One local sandbox; batches of ``--batch`` execs alternate between the real filter and an allow-all filter of the
same ABIs (so installing a filter costs both sides alike and only the rules differ). A batch's CPU is what the
trainer's children used (``RUSAGE_CHILDREN``: the launchers and, through them, the commands). Two workloads:
``true`` (few syscalls) and ``find /usr -maxdepth 3`` (tens of thousands of syscalls). Prints the median CPU and wall
per exec of each side, their ratio, the filter's build time (once per process) and the load average.

Usage: ``python benchmarks/seccomp_cost.py [--rounds 7] [--batch 20]`` (as root, with bwrap and the local rootfs).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from harbor_gym.config import EnvConfig
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.local import LocalSandbox, _exec, _seccomp

WORKLOADS = {"true": ["/bin/true"], "find": ["/bin/sh", "-c", "find /usr -maxdepth 3 >/dev/null"]}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _batch(sb: LocalSandbox, argv: list[str], n: int) -> tuple[float, float]:
    cpu0, t0 = _children_cpu(), time.perf_counter()
    for _ in range(n):
        r = sb.exec(argv, timeout=120)
        if r.exit_code != 0:
            raise SystemExit(f"{argv} failed: {r}")
    return (_children_cpu() - cpu0) / n, (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    t0 = time.perf_counter()
    real = _seccomp.program(_exec._CAPS)
    build_ms = (time.perf_counter() - t0) * 1e3
    allow_all = _seccomp.allow_all_program()
    sides = {"filter": lambda caps: real, "allow-all": lambda caps: allow_all}
    original = _seccomp.program
    settings = SandboxSettings.from_config(EnvConfig())
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        with LocalSandbox(SandboxSpec(image="harbor-gym/base:bookworm"), settings) as sb:
            for name, argv in WORKLOADS.items():
                _batch(sb, argv, 2)  # warm caches
                for _ in range(max(3, args.rounds)):
                    for side, prog in sides.items():
                        _seccomp.program = prog
                        results.setdefault((name, side), []).append(_batch(sb, argv, args.batch))
    finally:
        _seccomp.program = original
    print(f"filter: {len(real) // 8} BPF instructions, built in {build_ms:.1f} ms (once per process)")
    for name in WORKLOADS:
        med = {side: (statistics.median(c for c, _ in results[(name, side)]) * 1e3,
                      statistics.median(w for _, w in results[(name, side)]) * 1e3) for side in sides}
        (fc, fw), (ac, aw) = med["filter"], med["allow-all"]
        print(f"{name:5} cpu/exec filter {fc:.2f} ms, allow-all {ac:.2f} ms, ratio {fc / ac:.3f} | "
              f"wall/exec filter {fw:.2f} ms, allow-all {aw:.2f} ms")
    print("loadavg %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
