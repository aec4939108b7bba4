"""Benchmarks of the rollout collector (issue 15), reported, not asserted. Needs a Docker engine.

    python3 benchmarks/collector.py [--episodes 128] [--concurrency 32] [--mixed-episodes 32] [--only A,B]

A. Waiting agents: the collector's steady-state episodes per second over ``--episodes`` episodes of a 2-turn task
   whose async agent waits 2 s per turn (a model call), at ``--concurrency``, against the same collector with an
   agent that does not wait (this engine's ceiling). Target ratio >= 0.8. Steady state: episodes finished after the
   first ``concurrency`` ones, over the time since the ``concurrency``-th one.
B. Mixed turns: 8 slots, 2 turns, each turn's command takes 0.1 s or 3 s (p = 1/2, drawn from the episode seed and
   the turn index), ``--mixed-episodes`` episodes with the same seeds on both sides: the collector
   (``concurrency=8``) against the lock-step `HarborVectorEnv` (8 slots reset with those seeds, stepped together).
   Target >= 1.5x.
C. During A's waiting run: host RSS per in-flight episode (RSS growth over the idle baseline divided by the
   episodes in flight at the sample) and the p99 lag of a 50 ms ticker task on the same loop.

Prints one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import harbor_gym  # noqa: E402
from harbor_gym.agents import AgentOutcome  # noqa: E402
from harbor_gym.run.rows import episode_seed  # noqa: E402
from task_folders import grade, toml, write_task  # noqa: E402

CONFIG = {"backend": "docker", "labels": {"io.harbor-gym.bench": "collector"}, "seed_retries": 1}
TICK_S = 0.05


def _task(root: Path) -> Path:
    files = {"task.toml": toml(["a", "b"], agent_timeout=30)}
    for step in ("a", "b"):
        files[f"steps/{step}/tests/test.sh"] = grade(f"grep -qx ok /app/{step}.txt")
    return write_task(root, files, "bench-two-step")


class Waiter:
    """Async agent: waits ``delay`` seconds (a model call), then writes the step's answer with ``aexec``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def run(self, turn):
        if self.delay:
            await asyncio.sleep(self.delay)
        res = await turn.aexec(f"echo ok > /app/{turn.step_name}.txt")
        return AgentOutcome(exit_code=res.exit_code)


def turn_seconds(seed: int, index: int) -> float:
    """0.1 s or 3 s with p = 1/2, from the episode seed and the turn index."""
    return 3.0 if random.Random(seed * 1000 + index).random() < 0.5 else 0.1


class Mixed:
    """Sync agent: the turn's command takes `turn_seconds` (inside the sandbox), then writes the answer."""

    def run(self, turn):
        d = turn_seconds(int(turn.seed), turn.index)
        res = turn.exec(f"sleep {d}; echo ok > /app/{turn.step_name}.txt")
        return AgentOutcome(exit_code=res.exit_code)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        await asyncio.sleep(TICK_S)
        lags.append(time.monotonic() - t0 - TICK_S)


async def _collect(task: Path, delay: float, episodes: int, concurrency: int, probe: bool) -> dict:
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop)) if probe else None
    base_rss = _rss_mb()
    in_flight = {"n": 0}
    rss_samples: list[float] = []

    class Listener:
        def episode_started(self, task_id, rollout):
            in_flight["n"] += 1

    async def sample():
        while not stop.is_set():
            await asyncio.sleep(1.0)
            if in_flight["n"] >= concurrency // 2:
                rss_samples.append((_rss_mb() - base_rss) / in_flight["n"])

    sampler = asyncio.create_task(sample()) if probe else None
    finished: list[float] = []
    graded = 0
    t0 = time.monotonic()
    async for result in harbor_gym.rollouts(task, agent=lambda t, k, s: Waiter(delay), rollouts_per_task=episodes,
                                            concurrency=concurrency, config=CONFIG, listener=Listener()):
        in_flight["n"] -= 1
        finished.append(time.monotonic())
        graded += bool(result.graded and result.reward == 1.0)
    total = time.monotonic() - t0
    stop.set()
    for t in (ticker, sampler):
        if t is not None:
            await t
    warm = min(concurrency, len(finished) - 1)
    steady = (len(finished) - warm) / max(1e-9, finished[-1] - finished[warm - 1]) if warm >= 1 else 0.0
    out = {"episodes": len(finished), "scored_1": graded, "wall_s": round(total, 1),
           "steady_eps": round(steady, 3), "overall_eps": round(len(finished) / total, 3)}
    if probe:
        lags_sorted = sorted(lags)
        out["ticker_p99_ms"] = round(1000 * lags_sorted[int(0.99 * (len(lags_sorted) - 1))], 1) if lags else None
        out["ticker_max_ms"] = round(1000 * max(lags), 1) if lags else None
        out["rss_mb_per_inflight_episode"] = round(statistics.median(rss_samples), 2) if rss_samples else None
    return out


def bench_waiting(task: Path, episodes: int, concurrency: int) -> dict:
    waiting = asyncio.run(_collect(task, 2.0, episodes, concurrency, probe=True))
    ceiling = asyncio.run(_collect(task, 0.0, episodes, concurrency, probe=False))
    return {"waiting_2s": waiting, "not_waiting": ceiling,
            "ratio": round(waiting["steady_eps"] / max(1e-9, ceiling["steady_eps"]), 3), "target": 0.8}


def bench_mixed(task: Path, episodes: int, slots: int = 8, base_seed: int = 3, pool: int = 0) -> dict:
    """``pool > 0``: both sides take their sandboxes from warm pools of that size (seeding off the clock)."""
    from harbor_gym.vector import HarborVectorEnv

    seeds = [episode_seed(base_seed, task.name, k) for k in range(episodes)]
    t0 = time.monotonic()
    config = {**CONFIG, "pool_size": pool}
    results = harbor_gym.collect(task, lambda t, k, s: Mixed(), rollouts_per_task=episodes, concurrency=slots,
                                 config=config, seed=base_seed)
    collector_s = time.monotonic() - t0
    assert sorted(r.seed for r in results) == sorted(seeds)
    venv = HarborVectorEnv(slots, path=task, config=config, autoreset_mode="disabled", pool_size=pool,
                           on_error="mask")
    t0 = time.monotonic()
    try:
        for start in range(0, episodes, slots):
            batch = seeds[start:start + slots]
            batch += batch[: slots - len(batch)]  # a last partial round: fill with repeats (timed as lock-step)
            venv.reset(seed=batch)
            for _ in range(2):
                venv.step([Mixed()] * slots)
    finally:
        vector_s = time.monotonic() - t0
        venv.close()
    if pool:
        from harbor_gym.sandbox.pool import close_pools

        close_pools()
    return {"episodes": episodes, "slots": slots, "warm_pool": pool, "collector_s": round(collector_s, 1),
            "lockstep_vector_s": round(vector_s, 1), "speedup": round(vector_s / collector_s, 2), "target": 1.5,
            "collector_graded": sum(r.graded for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--mixed-episodes", type=int, default=32)
    parser.add_argument("--only", default="A,B", help="which benchmarks: A (and C), B")
    parser.add_argument("--pool", type=int, default=0, help="B: warm pool size on both sides (0: none)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hg-bench-collector-"))
    task = _task(root)
    out: dict = {}
    wanted = set(args.only.upper().split(","))
    if "B" in wanted:
        out["B_mixed_turns"] = bench_mixed(task, args.mixed_episodes, pool=args.pool)
    if "A" in wanted:
        out["A_waiting_agents"] = bench_waiting(task, args.episodes, args.concurrency)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
