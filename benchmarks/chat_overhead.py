"""ChatAgent's own overhead per model call, and ``turn.exec`` against a raw engine exec (SPEC GYM-13; reported, not
asserted).

1. Harness overhead per model call, server time excluded: `ChatAgent` runs ``--calls`` calls against the scripted
   policy server of the tests (127.0.0.1) with commands answered by an instant in-memory exec, so what is left of
   the activation's wall time after the calls' HTTP latency is the harness's own work per call (building the
   request, parsing tokens and logprobs, the delta, recording, ATIF steps). Also shown: the client + HTTP transport
   per call (latency minus the time the server spent in its handler). Target: harness <= 5 ms per call.
2. ``turn.exec("true")`` round trip on a Docker sandbox against the same command through the Docker SDK's
   ``exec_run`` on the same container (the same engine API over the same socket), alternated, ``--execs`` each;
   medians and their ratio. Target: <= 1.2x.

Usage: ``python benchmarks/chat_overhead.py [--calls 200] [--execs 50] [--image harbor-gym/base:bookworm]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from policy_server import PolicyServer  # noqa: E402

from harbor_gym.agents import ChatAgent, Turn  # noqa: E402
from harbor_gym.sandbox.base import ExecResult  # noqa: E402


def harness_overhead(calls: int) -> None:
    server = PolicyServer().start()
    try:
        agent = ChatAgent("policy-loop", server.url, max_steps=calls)
        instant = lambda *args, **kwargs: ExecResult(exit_code=0, stdout="again\n")  # noqa: E731
        # warm-up: client creation, first connection
        agent.run(Turn("s", 0, 1, "warm up", None, None, "/app", _exec_fn=instant, seed=0))
        server.handler_s.clear()
        turn = Turn("s", 0, 1, "Keep going.", None, None, "/app", _exec_fn=instant, seed=1)
        t0 = time.perf_counter()
        agent.run(turn)
        wall = time.perf_counter() - t0
        latency = [c.latency_s for c in turn.model_calls]
        transport = [lat - srv for lat, srv in zip(latency, server.handler_s)]
        n = len(latency)
        print(f"model calls: {n}; activation {wall:.3f} s; HTTP latency median {statistics.median(latency) * 1e3:.2f} "
              f"ms (server handler median {statistics.median(server.handler_s) * 1e3:.2f} ms)")
        print(f"client + transport per call (latency - server): median {statistics.median(transport) * 1e3:.2f} ms")
        print(f"harness overhead per call (wall - latency, server excluded): {(wall - sum(latency)) / n * 1e3:.3f} ms "
              "(target <= 5 ms)")
    finally:
        server.stop()


def exec_ratio(execs: int, image: str) -> None:
    from harbor_gym import sandbox
    from harbor_gym.sandbox import SandboxSettings, SandboxSpec

    spec = SandboxSpec(image=image, workdir="/app", name_hint="bench-chat")
    with sandbox.open(spec, backend="docker", settings=SandboxSettings(labels={"io.harbor-gym.run": "benchmark"})
                      ) as sb:
        import docker

        client = docker.from_env()
        container = client.containers.get(sb.name)
        turn = Turn("s", 0, 1, "", None, 600.0, "/app", _exec_fn=sb.exec, _deadline=time.monotonic() + 600)
        ours, raw, plain = [], [], []
        for _ in range(3):  # warm-up
            turn.exec("true")
            container.exec_run(["/bin/sh", "-c", "true"], workdir="/app", demux=True)
        for _ in range(execs):
            t0 = time.perf_counter()
            turn.exec("true")
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            container.exec_run(["/bin/sh", "-c", "true"], workdir="/app", demux=True)
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            sb.exec("true", cwd="/app", timeout=600.0)
            plain.append(time.perf_counter() - t0)
        client.close()
    m_ours, m_raw, m_sb = (statistics.median(x) * 1e3 for x in (ours, raw, plain))
    print(f"turn.exec median {m_ours:.2f} ms; sandbox.exec median {m_sb:.2f} ms; Docker SDK exec_run median "
          f"{m_raw:.2f} ms")
    print(f"turn.exec / sandbox.exec: {m_ours / m_sb:.3f}")
    print(f"ratio {m_ours / m_raw:.3f} (turn.exec / raw engine exec; target <= 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--image", default="harbor-gym/base:bookworm")
    args = parser.parse_args()
    harness_overhead(args.calls)
    exec_ratio(args.execs, args.image)


if __name__ == "__main__":
    main()
