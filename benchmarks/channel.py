"""Per-turn cost of the trusted channel (GYM-10): harbor_gym reading a turn's verifier results, against a floor
that uses the same transport and does the same work.

One Docker container holds a typical ``/logs/verifier`` (reward.json, reward.txt, a 64 KiB test-stdout.txt, a few
small logs). Measured side: what the engine does after each verifier run: ``copy_out("/logs/verifier")`` under
a fresh turn `CopyBudget` (names checked, links recorded, sizes capped while streaming), then the reward files
judged (`reward_reading`). Floor: the raw Docker SDK ``get_archive`` of the same folder, its tar stream parsed with
``tarfile`` and every regular member written to a fresh folder, then the same reward parse. Both sides write
into a fresh temporary folder per read.

Batches are interleaved (floor, channel, floor, channel, ...; the order alternates), ``--batches`` of them (at
least 5) with ``--reads`` reads each; per batch the ratio of the medians; printed: the median ratio and its spread
(min..max over batches), the last line as ``ratio <channel/floor>``. Target: <= 1.25.

Usage: ``python benchmarks/channel.py [--batches 7] [--reads 20] [--image harbor-gym/base:bookworm]``
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import docker

from harbor_gym import sandbox
from harbor_gym.config import EnvConfig
from harbor_gym.episode._rewards import REWARD_FILES, read_reward_files, reward_reading
from harbor_gym.sandbox import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.channel import CopyBudget

SEED_LOGS = (
    "mkdir -p /logs/verifier && cd /logs/verifier && echo '{\"reward\": 1.0, \"tests\": 0.75}' > reward.json && "
    "echo 1 > reward.txt && head -c 65536 /dev/urandom | base64 > test-stdout.txt && "
    "for i in 1 2 3 4; do echo log $i > extra-$i.log; done"
)


def floor_read(client: docker.DockerClient, cid: str, dest: Path) -> float:
    """Raw SDK: get_archive, parse the stream, write regular members, parse the reward."""
    stream, _ = client.api.get_archive(cid, "/logs/verifier", chunk_size=1 << 16)
    texts: dict[str, str] = {}
    with tarfile.open(fileobj=io.BufferedReader(_Raw(stream), 1 << 16), mode="r|") as tar:
        for member in tar:
            if not member.isreg():
                continue
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            data = tar.extractfile(member).read()
            (dest / rel).write_bytes(data)
            if rel in REWARD_FILES:
                texts[rel] = data.decode("utf-8", "replace")
    reading = read_reward_files(texts.get("reward.json"), texts.get("reward.txt"))
    return reading.rewards.get("reward", 0.0)


def channel_read(sb, dest: Path, config: EnvConfig) -> float:
    """harbor_gym: the trusted channel under a turn budget, then the capped reward judgement."""
    budget = CopyBudget(file_cap=config.copy_file_cap_bytes, turn_cap=config.copy_turn_cap_bytes)
    cap = config.reward_file_cap_bytes
    report = sb.copy_out("/logs/verifier", dest, budget=budget, reserved={n: cap for n in REWARD_FILES})
    return reward_reading(report, cap).rewards.get("reward", 0.0)


class _Raw(io.RawIOBase):
    def __init__(self, chunks) -> None:
        self._it, self._buf = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if not self._buf:
            self._buf = next(self._it, b"")
            if not self._buf:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def _timed(fn, reads: int) -> list[float]:
    out = []
    for _ in range(reads):
        with tempfile.TemporaryDirectory(prefix="hg-bench-") as tmp:
            dest = Path(tmp) / "verifier"
            dest.mkdir()
            t0 = time.perf_counter()
            reward = fn(dest)
            out.append(time.perf_counter() - t0)
            if reward != 1.0:
                raise SystemExit(f"wrong reward read: {reward}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--image", default="harbor-gym/base:bookworm")
    args = parser.parse_args()
    batches = max(5, args.batches)
    config = EnvConfig(backend="docker")
    client = docker.from_env(timeout=60)
    spec = SandboxSpec(image=args.image, workdir="/app", name_hint="bench-channel")
    with sandbox.open(spec, backend="docker", settings=SandboxSettings.from_config(config)) as sb:
        if not sb.exec(SEED_LOGS, timeout=60, user="root").ok:
            raise SystemExit("could not seed /logs/verifier")
        cid = client.api.inspect_container(sb.name)["Id"]
        floor = lambda d: floor_read(client, cid, d)  # noqa: E731
        chan = lambda d: channel_read(sb, d, config)  # noqa: E731
        _timed(floor, 3), _timed(chan, 3)  # warm-up
        ratios, f_meds, c_meds = [], [], []
        for i in range(batches):
            order = [("floor", floor), ("channel", chan)]
            if i % 2:
                order.reverse()
            got = {name: statistics.median(_timed(fn, args.reads)) for name, fn in order}
            f_meds.append(got["floor"])
            c_meds.append(got["channel"])
            ratios.append(got["channel"] / got["floor"])
            print(f"batch {i + 1}: floor {got['floor'] * 1e3:.2f} ms  channel {got['channel'] * 1e3:.2f} ms  "
                  f"ratio {ratios[-1]:.3f}")
    client.close()
    print(f"floor median {statistics.median(f_meds) * 1e3:.2f} ms, channel median "
          f"{statistics.median(c_meds) * 1e3:.2f} ms per turn read ({batches} batches x {args.reads} reads, "
          f"pid {os.getpid()})")
    print(f"ratio spread {min(ratios):.3f}..{max(ratios):.3f}")
    print(f"ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
