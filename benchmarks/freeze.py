"""Freeze cost (GYM-11): what ``freeze_agent_during_verify="auto"`` (the default) adds to a turn, against ``False``,
on the same task in one run.

Each batch runs the oracle over the task twice, once per setting, in alternating order (interleaved, so drift of
the shared host hits both alike), with ``--leftovers`` sleeping processes left behind by a background command in
every turn (what the freeze has to stop). Per episode the cost measured is the mean over its turns of the phases
the freeze touches: ``verify`` (the helper runs inside the verifier's exec) plus ``prepare`` (the thaw runs in the
next turn's preparation exec). The freeze's cost per turn is the paired difference of a batch (auto − off).

Prints every batch, then ``freeze cost per turn: median X ms (p25 .. p75: A .. B ms; n batches)``.

Run: ``python benchmarks/freeze.py [--task envs/cake] [--batches 7] [--leftovers 10]``.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=str(REPO / "envs" / "cake"))
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--leftovers", type=int, default=10)
    args = parser.parse_args()
    from harbor_gym.task import load_task

    task = load_task(args.task)
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
    q = statistics.quantiles(diffs, n=4) if len(diffs) >= 2 else [diffs[0]] * 3
    print(f"verify + prepare per turn: auto median {statistics.median(on_ms):.1f} ms, off median "
          f"{statistics.median(off_ms):.1f} ms")
    print(f"freeze cost per turn: median {statistics.median(diffs):.1f} ms (p25 .. p75: {q[0]:.1f} .. {q[2]:.1f} ms; "
          f"{len(diffs)} batches, {args.leftovers} leftover processes)")


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"took {time.monotonic() - t0:.0f} s")
