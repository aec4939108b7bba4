"""Throughput of harbor_gym on one host: reset latency cold vs warm, and episodes per second of the vector env.

Prints, in one run:
1. ``env.reset()`` latency (p50/p95) of the cake example, cold (no pool: the reset starts and seeds its sandbox)
   and warm (a pool of 2: the reset claims one started and seeded ahead, GYM-2; the pool is refilled between
   resets), with their ratio, and the same split for the sandbox acquisition alone (the ``sandbox_factory`` call,
   or its ``claim_prepared``, inside reset). Target: warm reset p50 <= 1/10 of cold.
2. Episodes per second of `HarborVectorEnv` (threads, same-step autoreset, warm pools filled first) for 1, 2, 4 and
   8 sub-envs on cake with the reference scripts (pure overhead; no target), and on a variant whose agent waits
   2 s on the host before each turn's script (standing in for model latency), with the speed-up of 8 sub-envs
   over 1 for that variant on the line with "speed-up". Target on a 2-core host: speed-up >= 5.

Usage: ``python benchmarks/throughput.py [--resets 12] [--episodes 2] [--wait 2.0]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import docker

from harbor_gym import HarborEnv
from harbor_gym.agents import AgentOutcome
from harbor_gym.sandbox.pool import close_pools, pool_factory, pools
from harbor_gym.task import load_task
from harbor_gym.vector import HarborVectorEnv, prewarm

REPO = Path(__file__).resolve().parents[1]
CAKE = REPO / "envs" / "cake"
LABEL = ("io.harbor-gym.benchmark", uuid.uuid4().hex[:12])
CONFIG = {"backend": "docker", "labels": dict([LABEL])}
SCRIPTS = {s.name: (s.solution_dir / "solve.sh").read_text() for s in load_task(CAKE).steps}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class _Timed:
    """Wrap a sandbox factory to time each acquisition."""

    def __init__(self, inner) -> None:
        self.inner, self.times = inner, []
        if hasattr(inner, "claim_prepared"):  # keep the pool's seeding-ahead hook visible to the episode
            self.claim_prepared = self._claim_prepared

    def __call__(self, spec):
        t0 = time.perf_counter()
        try:
            return self.inner(spec)
        finally:
            self.times.append(time.perf_counter() - t0)

    def _claim_prepared(self, spec, key, prepare):
        t0 = time.perf_counter()
        try:
            return self.inner.claim_prepared(spec, key, prepare)
        finally:
            self.times.append(time.perf_counter() - t0)


def _default_factory(spec):
    from harbor_gym import sandbox
    from harbor_gym.config import EnvConfig
    from harbor_gym.sandbox import SandboxSettings

    return sandbox.open(spec, backend="docker", settings=SandboxSettings.from_config(EnvConfig(**CONFIG)))


def reset_latency(resets: int) -> None:
    results = {}
    for kind in ("cold", "warm"):
        factory = _Timed(_default_factory if kind == "cold" else pool_factory(CONFIG, size=2))
        env = HarborEnv(CAKE, config=CONFIG, sandbox_factory=factory)
        times = []
        try:
            for i in range(resets + 1):
                if kind == "warm":
                    for pool in pools():
                        pool.fill(timeout=60)
                time.sleep(0.3)  # let the previous episode's teardown settle (it is not on the reset path)
                t0 = time.perf_counter()
                env.reset()
                if i:  # the first reset also loads the image info; not counted
                    times.append(time.perf_counter() - t0)
            results[kind] = (times, factory.times[1:])
        finally:
            env.close()
            close_pools()
    (cold, cold_acq), (warm, warm_acq) = results["cold"], results["warm"]
    print(f"reset latency cold: p50 {1000 * pct(cold, .5):7.1f} ms  p95 {1000 * pct(cold, .95):7.1f} ms "
          f"({len(cold)} resets, each starts and seeds its sandbox)")
    print(f"reset latency warm: p50 {1000 * pct(warm, .5):7.1f} ms  p95 {1000 * pct(warm, .95):7.1f} ms "
          f"({len(warm)} resets, each claims a pooled sandbox seeded ahead)")
    print(f"warm/cold reset p50 ratio: {pct(warm, .5) / pct(cold, .5):.3f} (target <= 0.100)")
    print(f"sandbox acquisition inside reset: cold p50 {1000 * pct(cold_acq, .5):.1f} ms, warm p50 "
          f"{1000 * pct(warm_acq, .5):.1f} ms, ratio {pct(warm_acq, .5) / pct(cold_acq, .5):.3f} (cold: the "
          "start alone, its seeding follows on the reset path; warm: the claim of a sandbox already seeded)")


class WaitingAgent:
    """Waits ``wait_s`` on the host (model latency), then runs the step's reference script in the sandbox."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    def run(self, turn):
        time.sleep(self.wait_s)
        res = turn.exec(SCRIPTS[turn.step_name], timeout=60)
        return AgentOutcome(status="completed", exit_code=res.exit_code)


def episodes_per_second(num_envs: int, episodes: int, agent=None) -> float:
    """Run until every sub-env finished ``episodes`` episodes; completed episodes / wall time."""
    prewarm(CAKE, size=num_envs, config=CONFIG)
    venv = HarborVectorEnv(num_envs, path=CAKE, config=CONFIG, pool_size=num_envs)
    try:
        done = [0] * num_envs
        t0 = time.perf_counter()
        obs, _ = venv.reset(seed=0)
        while min(done) < episodes:
            actions = [agent if agent is not None else SCRIPTS[step] for step in obs["step_name"]]
            obs, reward, term, trunc, info = venv.step(actions)
            if trunc.any():
                print(f"  warning: truncated sub-envs {trunc.nonzero()[0].tolist()}", file=sys.stderr)
            for i in range(num_envs):
                done[i] += int(term[i] or trunc[i])
        elapsed = time.perf_counter() - t0
    finally:
        venv.close()
        close_pools()
    return sum(done) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resets", type=int, default=12)
    parser.add_argument("--episodes", type=int, default=2, help="episodes per sub-env per measurement")
    parser.add_argument("--wait", type=float, default=2.0, help="host-side wait of the agent per turn (s)")
    args = parser.parse_args()
    client = docker.from_env()
    try:
        reset_latency(args.resets)
        for name, agent in (("cake, reference scripts (pure overhead)", None),
                            (f"cake, agent waiting {args.wait:g} s per turn", WaitingAgent(args.wait))):
            rates = {}
            for n in (1, 2, 4, 8):
                rates[n] = episodes_per_second(n, args.episodes, agent)
                print(f"episodes/s {name}: {n} sub-env(s): {rates[n]:.3f}")
            if agent is not None:
                print(f"speed-up 8 vs 1 sub-envs ({name}): {rates[8] / rates[1]:.2f} (target >= 5)")
            else:
                print(f"scaling 8 vs 1 sub-envs ({name}): {rates[8] / rates[1]:.2f} (reported, no target)")
    finally:
        close_pools()
        left = client.api.containers(all=True, filters={"label": "=".join(LABEL)})
        for c in left:
            client.api.remove_container(c["Id"], force=True)
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
