"""Episode overhead: the oracle over envs/cake through `Episode`, against a plain-SDK runner doing only what the
episode needs (create and start one container; per step one archive upload and the execs of setup, solution and
test.sh and one read of the reward file; remove). Prints the medians and a line with ``ratio`` (target <= 1.25).

Run: ``python benchmarks/episode_overhead.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAKE = REPO / "envs" / "cake"


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def plain_sdk_run(client, image: str) -> float:
    """The floor: what any runner of cake must do through the Docker SDK."""
    t0 = time.perf_counter()
    container = client.containers.create(image, command=["sleep", "infinity"], working_dir="/app",
                                          network_disabled=True, labels={"io.harbor-gym.managed": "true"})
    try:
        container.start()
        container.exec_run(["mkdir", "-p", "/app", "/logs/verifier"])
        for step in sorted((CAKE / "steps").iterdir()):
            files = {
                "solution/solve.sh": ((step / "solution" / "solve.sh").read_bytes(), 0o755),
                "tests/test.sh": ((step / "tests" / "test.sh").read_bytes(), 0o755),
            }
            container.put_archive("/", _tar(files))
            setup = step / "workdir" / "setup.sh"
            if setup.exists():
                container.exec_run(["bash", "/app/setup.sh"], workdir="/app")
            container.exec_run(["bash", "-c", "/solution/solve.sh > /dev/null 2>&1"], workdir="/app")
            container.exec_run(["bash", "-c", "bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"],
                               workdir="/app")
            stream, _ = container.get_archive("/logs/verifier/reward.txt")
            data = b"".join(stream)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.getmembers()[0]
                reward = float(tar.extractfile(member).read())
            if reward != 1.0:
                raise RuntimeError(f"plain runner: step {step.name} scored {reward}")
    finally:
        container.remove(force=True)
    return time.perf_counter() - t0


def episode_run() -> float:
    from harbor_gym.agents import Oracle
    from harbor_gym.config import EnvConfig
    from harbor_gym.episode import Episode

    t0 = time.perf_counter()
    with Episode(CAKE, EnvConfig(backend="docker"), agent=Oracle()) as ep:
        ep.start()
        while ep.next_step is not None:
            ep.run_turn(Oracle())
        result = ep.result()
    if result.reward != 1.0:
        raise RuntimeError(f"episode scored {result.reward}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    import docker

    from harbor_gym.config import EnvConfig

    image = EnvConfig().effective_image_aliases().get("debian:bookworm-slim", "debian:bookworm-slim")
    client = docker.from_env(timeout=60)
    episode_run()  # warm-up (image resolution caches, imports)
    plain_sdk_run(client, image)
    ep_times, sdk_times = [], []
    for _ in range(max(5, args.runs)):  # interleaved so drift hits both alike
        sdk_times.append(plain_sdk_run(client, image))
        ep_times.append(episode_run())
    ep_med, sdk_med = statistics.median(ep_times), statistics.median(sdk_times)
    print(f"episode (oracle over cake): median {ep_med:.3f} s over {len(ep_times)} runs")
    print(f"plain SDK runner:           median {sdk_med:.3f} s over {len(sdk_times)} runs")
    print(f"ratio episode/plain-sdk = {ep_med / sdk_med:.3f} (target <= 1.25)")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
