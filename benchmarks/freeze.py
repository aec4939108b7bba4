"""Freeze cost (GYM-11): what ``freeze_agent_during_verify="auto"`` (the default) adds to a turn, against ``False``,
on the same task in one run.

Each batch runs the oracle over the task twice, once per setting, in alternating order (interleaved, so drift of
the shared host hits both alike), with ``--leftovers`` sleeping processes left behind by a background command in
every turn (what the freeze has to stop). Per episode the cost measured is the mean over its turns of the phases
the freeze touches: ``verify`` (the helper runs inside the verifier's exec) plus ``prepare`` (the thaw runs in the
next turn's preparation exec). The freeze's cost per turn is the paired difference of a batch (auto − off).

Then, isolated from everything else a turn does: in one sandbox of the task's image, the freeze helper followed by
the thaw, against an empty command, interleaved, timed inside the sandbox. Both fragments ride on execs a turn makes
anyway (the verifier's, the next preparation's), so this is the time the freeze adds to a turn: the figure that
stays readable on a loaded host, where engine round trips vary by seconds.

Prints every batch, the episode-level median and spread, then ``freeze cost per turn (helper + thaw, isolated):
median X ms (p25 .. p75: A .. B ms; n interleaved pairs)``.

Run: ``python benchmarks/freeze.py [--task envs/cake] [--batches 7] [--leftovers 10] [--pairs 21]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _episode_cost_ms(task, freeze, leftovers: int) -> float:
    from harbor_gym.agents import Oracle
    from harbor_gym.config import EnvConfig
    from harbor_gym.episode import Episode

    cfg = EnvConfig(backend="docker", freeze_agent_during_verify=freeze, labels={"io.harbor-gym.bench": "freeze"})
    costs = []
    with Episode(task, cfg, agent=Oracle()) as ep:
        ep.start()
        while ep.next_step is not None:
            if leftovers:  # processes left behind between turns, as an agent's would be
                ep.sandbox.exec(f"for i in $(seq {leftovers}); do setsid sleep 600 </dev/null >/dev/null 2>&1 & "
                                "done", timeout=30, user="root")
            record = ep.run_turn(Oracle()).record
            if record.reward is None:
                raise RuntimeError(f"turn {record.step_name} failed: {record.failure_message}")
            costs.append(record.timings.get("verify", 0.0) + record.timings.get("prepare", 0.0))
    return 1000.0 * statistics.fmean(costs)


def _helper_cost_ms(task, pairs: int, leftovers: int) -> list[float]:
    """The freeze's own work, isolated: in one sandbox of the task's image with ``leftovers`` processes, the freeze
    helper followed by the thaw against an empty command, interleaved, timed inside the sandbox (``date +%s%N``) so
    that engine round trips (unchanged by the freeze: both fragments ride on execs a turn makes anyway) stay out."""
    from harbor_gym import sandbox as sandbox_pkg
    from harbor_gym.config import EnvConfig
    from harbor_gym.episode._freeze import freeze_fragment, thaw_fragment
    from harbor_gym.episode._shell import Script
    from harbor_gym.episode._spec import agent_spec
    from harbor_gym.sandbox.base import SandboxSettings

    cfg = EnvConfig(backend="docker", labels={"io.harbor-gym.bench": "freeze"})
    spec = agent_spec(task, env={}, pids_limit=cfg.pids_limit)
    both = Script()
    freeze_fragment(both, "auto")
    thaw_fragment(both)
    body = "\n".join(both.parts)
    loop = (f"mkdir -p /.harbor_gym; for i in $(seq {leftovers}); do setsid sleep 600 </dev/null >/dev/null 2>&1 & "
            f"done; sleep 0.5; for i in $(seq {pairs}); do "
            "a=$(date +%s%N); { " + body + "\n} >/dev/null; b=$(date +%s%N); : >/dev/null; c=$(date +%s%N); "
            "echo pair $((b - a)) $((c - b)); done")
    diffs = []
    with sandbox_pkg.open(spec, backend="docker", settings=SandboxSettings.from_config(cfg)) as sb:
        res = sb.exec(["bash", "-c", loop], timeout=600, user="root")
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "pair":
                diffs.append((int(parts[1]) - int(parts[2])) / 1e6)
    if not diffs:
        raise RuntimeError(f"no measurement: {res.stdout[-500:]} {res.stderr[-500:]}")
    return diffs


def _spread(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=str(REPO / "envs" / "cake"))
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--leftovers", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=21, help="interleaved pairs of the isolated helper measure")
    args = parser.parse_args()
    from harbor_gym.task import load_task

    task = load_task(args.task)
    if args.batches:
        _episode_cost_ms(task, False, 0)  # warm the image cache and the engine
    diffs, on_ms, off_ms = [], [], []
    for b in range(args.batches):
        order = ("auto", False) if b % 2 == 0 else (False, "auto")
        got = {}
        for freeze in order:
            got[freeze] = _episode_cost_ms(task, freeze, args.leftovers)
        on_ms.append(got["auto"])
        off_ms.append(got[False])
        diffs.append(got["auto"] - got[False])
        print(f"batch {b + 1}: auto {got['auto']:.1f} ms, off {got[False]:.1f} ms per turn "
              f"(verify + prepare), diff {diffs[-1]:+.1f} ms", flush=True)
    if diffs:
        _report_episodes(diffs, on_ms, off_ms, args.leftovers)
    helper = _helper_cost_ms(task, args.pairs, args.leftovers)
    lo, hi = _spread(helper)
    print(f"freeze cost per turn (helper + thaw, isolated): median {statistics.median(helper):.1f} ms (p25 .. p75: "
          f"{lo:.1f} .. {hi:.1f} ms; {len(helper)} interleaved pairs, {args.leftovers} leftover processes)")


def _report_episodes(diffs: list[float], on_ms: list[float], off_ms: list[float], leftovers: int) -> None:
    lo, hi = _spread(diffs)
    print(f"verify + prepare per turn: auto median {statistics.median(on_ms):.1f} ms, off median "
          f"{statistics.median(off_ms):.1f} ms")
    print(f"episode-level freeze cost per turn: median {statistics.median(diffs):.1f} ms (p25 .. p75: {lo:.1f} .. "
          f"{hi:.1f} ms; {len(diffs)} batches, {leftovers} leftover processes)")


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"took {time.monotonic() - t0:.0f} s")
