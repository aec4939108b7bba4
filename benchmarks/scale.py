"""Scale model inputs (issue 17 item 4), measured on this machine for a small no-network one-turn task:

- engine requests per episode (`harbor_gym.sandbox._engine.count_requests` on the process's shared client),
- host CPU (this process: user + system) per episode, and RSS per in-flight episode,
- engine CPU per episode: the CPU time deltas of ``dockerd`` and its ``containerd`` (from ``/proc/<pid>/stat``),
- throughput at 1, 2, 4 and 8 episodes in flight (the rollout collector, threads),
- with ``--ray``: the Ray driver's CPU per episode (collector, ``executor="ray"``, a local one-node cluster).

Each episode holds its sandbox for ``--hold`` seconds (an agent "thinking"), so that in-flight episodes overlap.
Writes ``benchmarks/results/scale.json`` and ``scale.md`` (the numbers docs/scale.md quotes).

Run: ``python benchmarks/scale.py [--episodes 16] [--hold 1.0] [--ray]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"
CONFIG = {"backend": "docker", "pull_policy": "never", "labels": {"io.harbor-gym.bench": "scale"}}
TICK = os.sysconf("SC_CLK_TCK")

TASK_TOML = """schema_version = "1.4"
[environment]
docker_image = "debian:bookworm-slim"
workdir = "/app"
network_mode = "no-network"
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 30
"""
TEST_SH = "#!/bin/bash\nif [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"


def write_task(root: Path) -> Path:
    task = root / "scale-task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "environment" / ".gitkeep").write_text("")
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Touch /app/done.\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    os.chmod(task / "tests" / "test.sh", 0o755)
    return task


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def engine_pids() -> dict[str, int]:
    """The host engine's dockerd (not a test's private one, under /tmp/hg-eng-*) and its containerd child."""
    procs: dict[int, tuple[str, int, bytes]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(entry)] = (os.path.basename(argv.split(b"\0")[0].decode(errors="replace")), ppid, argv)
    dockerd = next((pid for pid, (name, _, argv) in procs.items() if name == "dockerd" and b"hg-eng-" not in argv),
                   None)
    out = {"dockerd": dockerd} if dockerd else {}
    for pid, (name, ppid, _) in procs.items():
        if name == "containerd" and ppid == dockerd:
            out["containerd"] = pid
    return out


def engine_cpu_s(pids: dict[str, int]) -> float:
    return sum(_cpu_s(pid) for pid in pids.values())


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """The peak RSS of this process while it runs (sampled every 50 ms)."""

    def __init__(self) -> None:
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def requests_per_episode(task: Path, runs: int, hold: float) -> dict:
    """Engine requests of one episode (reset, one step, close), by method + first path segment, averaged."""
    from harbor_gym import HarborEnv
    from harbor_gym.sandbox._engine import count_requests, get_client

    counter = count_requests(get_client())
    action = f"sleep {hold}; touch /app/done"
    env = HarborEnv(task, config=CONFIG)
    env.reset(seed=0)
    env.step(action)  # warm-up: the reaper check, image inspect and client caches happen once per process
    env.close()
    counter.reset()
    for i in range(runs):
        env = HarborEnv(task, config=CONFIG)
        env.reset(seed=i)
        _, reward, *_ = env.step(action)
        env.close()
        if reward != 1.0:
            raise RuntimeError(f"the episode scored {reward}")
    kinds: dict[str, int] = {}
    for path in counter.paths:
        method, url = path.split(" ", 1)
        parts = [re.sub(r"^[0-9a-f]{12,64}$", "{id}", p) for p in url.split("?")[0].split("/")
                 if p and not p.startswith("v1.")]
        key = f"{method} /{parts[0]}/{parts[-1]}" if len(parts) > 1 else f"{method} /{'/'.join(parts)}"
        kinds[key] = kinds.get(key, 0) + 1
    return {"per_episode": counter.count / runs,
            "by_kind": {k: round(v / runs, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}


def in_flight(task: Path, concurrency: int, episodes: int, hold: float, executor: str = "threads") -> dict:
    """``episodes`` episodes through the collector, ``concurrency`` in flight: throughput and costs."""
    import harbor_gym

    pids = engine_pids()
    agent = f"sleep {hold}; touch /app/done"
    base_rss = rss_mb()
    e0, c0, t0 = engine_cpu_s(pids), self_cpu_s(), time.perf_counter()
    with RssSampler() as rss:
        results = harbor_gym.collect(task, lambda *_: agent, rollouts_per_task=episodes, concurrency=concurrency,
                                     config=CONFIG, executor=executor, seed=1, retries=0)
    wall = time.perf_counter() - t0
    host_cpu, engine_cpu = self_cpu_s() - c0, engine_cpu_s(pids) - e0
    graded = sum(1 for r in results if r.graded and r.reward == 1.0)
    if graded != episodes:
        raise RuntimeError(f"{episodes - graded} episode(s) failed: {[r.reason for r in results if not r.graded]}")
    return {"executor": executor, "concurrency": concurrency, "episodes": episodes, "wall_s": round(wall, 2),
            "episodes_per_s": round(episodes / wall, 3),
            "host_cpu_s_per_episode": round(host_cpu / episodes, 4),
            "engine_cpu_s_per_episode": round(engine_cpu / episodes, 4),
            "rss_base_mb": round(base_rss, 1), "rss_peak_mb": round(rss.peak, 1),
            "rss_mb_per_inflight": round(max(0.0, rss.peak - base_rss) / concurrency, 2),
            "mean_episode_s": round(sum(r.duration_sec for r in results) / episodes, 3)}


def write_markdown(data: dict, path: Path) -> None:
    lines = [f"# Scale inputs ({data['machine']['cores']} cores, {data['machine']['engine']})", "",
             f"Engine requests per episode: **{data['requests']['per_episode']:.1f}**", "",
             "| requests by kind (per episode) | n |", "| --- | --- |"]
    lines += [f"| `{k}` | {v} |" for k, v in data["requests"]["by_kind"].items()]
    lines += ["", "| executor | in flight | episodes/s | host CPU s/ep | engine CPU s/ep | RSS MB/in-flight | "
                  "mean episode s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in data["runs"]:
        lines.append(f"| {row['executor']} | {row['concurrency']} | {row['episodes_per_s']} | "
                     f"{row['host_cpu_s_per_episode']} | {row['engine_cpu_s_per_episode']} | "
                     f"{row['rss_mb_per_inflight']} | {row['mean_episode_s']} |")
    lines += ["", f"Hold per episode: {data['hold_s']} s (the agent's think time)."]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--hold", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--ray", action="store_true", help="also the collector on a local one-node Ray cluster")
    args = parser.parse_args()
    import docker

    client = docker.from_env()
    info = client.info()
    with tempfile.TemporaryDirectory() as tmp:
        task = write_task(Path(tmp))
        data = {"machine": {"cores": os.cpu_count(), "engine": f"Docker {info.get('ServerVersion')} "
                                                                f"({info.get('Driver')})"},
                "hold_s": args.hold, "requests": requests_per_episode(task, 4, args.hold), "runs": []}
        print("requests per episode:", data["requests"]["per_episode"])
        for c in args.concurrency:
            row = in_flight(task, c, max(args.episodes, c), args.hold)
            print(row)
            data["runs"].append(row)
        if args.ray:
            from harbor_gym.vector._placement import ensure_ray

            ray = ensure_ray(4)
            try:
                row = in_flight(task, 2, args.episodes, args.hold, executor="ray")  # 2 cores: 2 worker processes
                print(row)
                data["runs"].append(row)
            finally:
                ray.shutdown()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scale.json").write_text(json.dumps(data, indent=2) + "\n")
    write_markdown(data, OUT / "scale.md")
    print(f"wrote {OUT / 'scale.json'} and {OUT / 'scale.md'}")


if __name__ == "__main__":
    main()
