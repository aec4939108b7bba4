"""Overhead of harbor_gym's Docker sandbox over the same Docker SDK calls made directly.

One fixed sequence: start, 3 uploads, 10 execs, 1 download, stop. Both sides run it alternately (``--runs`` times,
at least 5); the medians and their ratio are printed, the last line as ``ratio <harbor/plain>``. Target: <= 1.15.

Plain side: ``containers.run(detach=True, init=True)``, ``put_archive`` x3, ``exec_run`` x10, ``get_archive``
(extracted), ``remove(force=True)``. harbor_gym side: ``harbor_gym.sandbox.open``, ``put_bytes`` x3, ``exec`` x10,
``get``, ``stop`` (with its lease, wrapper, refusal checks and output capping).

Usage: ``python benchmarks/sandbox_overhead.py [--runs 7] [--image harbor-gym/base:bookworm]``
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import docker

from harbor_gym import sandbox
from harbor_gym.sandbox import SandboxSettings, SandboxSpec

LABELS = {"io.harbor-gym.managed": "true", "io.harbor-gym.run": "benchmark"}
FILES = [(f"/app/data/file{i}.txt", (f"payload {i}\n" * 200).encode()) for i in range(3)]
COMMANDS = [
    "echo hello",
    "ls -la /app/data",
    "cat /app/data/file0.txt | wc -l",
    "id -u",
    "test -d /app && echo yes",
    "printf 'x%.0s' 1 2 3",
    "echo to-stderr >&2",
    "mkdir -p /app/out && echo done > /app/out/result.txt",
    "uname -s",
    "true",
]


def _tar_one(path: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def plain_run(client: docker.DockerClient, image: str) -> float:
    """The sequence through the Docker SDK directly."""
    t0 = time.perf_counter()
    container = client.containers.run(image, ["sleep", "infinity"], detach=True, init=True, network_mode="none",
                                       working_dir="/app", labels=LABELS)
    try:
        for path, data in FILES:
            container.put_archive("/", _tar_one(path, data))
        for cmd in COMMANDS:
            container.exec_run(["/bin/sh", "-c", cmd], demux=True)
        stream, _ = container.get_archive("/app/out")
        with tempfile.TemporaryDirectory() as out:
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                tar.extractall(out)
    finally:
        container.remove(force=True)
    return time.perf_counter() - t0


def harbor_run(image: str, settings: SandboxSettings) -> float:
    """The sequence through harbor_gym."""
    t0 = time.perf_counter()
    spec = SandboxSpec(image=image, workdir="/app", name_hint="bench")
    with sandbox.open(spec, backend="docker", settings=settings) as sb:
        for path, data in FILES:
            sb.put_bytes(data, path)
        for cmd in COMMANDS:
            sb.exec(cmd, timeout=30)
        with tempfile.TemporaryDirectory() as out:
            sb.get("/app/out", Path(out))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--image", default="harbor-gym/base:bookworm")
    args = parser.parse_args(argv)
    runs = max(5, args.runs)
    client = docker.from_env()
    settings = SandboxSettings(pull_policy="never")
    # warm both paths (image inspection cache, connection pool, page cache)
    plain_run(client, args.image)
    harbor_run(args.image, settings)
    plain, harbor = [], []
    for _ in range(runs):
        plain.append(plain_run(client, args.image))
        harbor.append(harbor_run(args.image, settings))
    p, h = statistics.median(plain), statistics.median(harbor)
    print(f"plain docker SDK : median {p * 1000:.1f} ms over {runs} runs ({', '.join(f'{x*1000:.0f}' for x in plain)})")
    print(f"harbor_gym       : median {h * 1000:.1f} ms over {runs} runs ({', '.join(f'{x*1000:.0f}' for x in harbor)})")
    print(f"ratio {h / p:.3f} (harbor_gym / plain SDK; target <= 1.15)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
