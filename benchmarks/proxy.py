"""The capture proxy's added latency per model call, upstream time excluded (issue 18; reported, not asserted).

The scripted policy server of the tests (127.0.0.1) is the upstream. Each round makes the same call twice, in
alternating order: once straight to the upstream (with the token options the proxy would add, so the upstream does
the same work) and once through a `CaptureProxy` session with an open activation window (the proxy adds the token
options, strips them from the answer and records the call). The added latency of a round is the proxy call's time
minus the direct call's; its p50 and p95 are reported, for plain and for streamed calls (time to the last byte).
Target: p50 <= 5 ms. Both calls use one keep-alive HTTP client, so client cost is the same on both paths.

Usage: ``python benchmarks/proxy.py [--rounds 300]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from policy_server import PolicyServer  # noqa: E402

from harbor_gym.agents._chat_wire import TOKEN_OPTIONS  # noqa: E402
from harbor_gym.proxy import CaptureProxy, ModelUpstream  # noqa: E402
from harbor_gym.proxy._exchange import httpx  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Make /app/a.txt hold alpha.\n$ echo alpha > /app/a.txt\n$ cat /app/a.txt"}]


def _timed_call(client, url: str, body: dict, headers: dict, stream: bool) -> float:
    t0 = time.perf_counter()
    if stream:
        with client.stream("POST", url, json=body, headers=headers) as response:
            response.raise_for_status()
            for _ in response.iter_raw():
                pass
    else:
        response = client.post(url, json=body, headers=headers)
        response.raise_for_status()
    return time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(rounds: int, stream: bool, server: PolicyServer, proxy: CaptureProxy, client) -> None:
    session = proxy.open_session(label="bench")
    body = {"model": "policy", "messages": MESSAGES, "temperature": 1.0, "max_tokens": 64}
    if stream:
        body["stream"] = True
    direct_body = {**body, **TOKEN_OPTIONS}
    if stream:
        direct_body["stream_options"] = {"include_usage": True}
    direct_url, proxy_url = server.url + "/chat/completions", session.base_url_for(
        f"127.0.0.1:{proxy.port}") + "/chat/completions"
    auth = {"authorization": f"Bearer {session.token}"}
    direct, proxied = [], []
    try:
        session.begin_activation(0)
        for _ in range(10):  # warm-up: connections, first-call costs
            _timed_call(client, direct_url, direct_body, {}, stream)
            _timed_call(client, proxy_url, body, auth, stream)
        session.end_activation()
        session.begin_activation(1)
        for i in range(rounds):
            if i % 2:
                d = _timed_call(client, direct_url, direct_body, {}, stream)
                p = _timed_call(client, proxy_url, body, auth, stream)
            else:
                p = _timed_call(client, proxy_url, body, auth, stream)
                d = _timed_call(client, direct_url, direct_body, {}, stream)
            direct.append(d)
            proxied.append(p)
        calls = session.end_activation().calls
    finally:
        session.close()
    added = [p - d for p, d in zip(proxied, direct)]
    ok = sum(1 for c in calls if c.status == "ok" and c.completion_token_ids)
    kind = "streamed" if stream else "plain"
    print(f"{kind:>8}: direct p50 {statistics.median(direct) * 1e3:6.2f} ms | proxy p50 "
          f"{statistics.median(proxied) * 1e3:6.2f} ms | added p50 {statistics.median(added) * 1e3:5.2f} ms, "
          f"p95 {_pct(added, 0.95) * 1e3:5.2f} ms (target p50 <= 5 ms) | {ok}/{rounds} calls recorded with tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    server = PolicyServer().start()
    proxy = CaptureProxy(ModelUpstream(base_url=server.url, api_key_env=None))
    proxy.start()
    client = httpx.Client(timeout=60, trust_env=False)
    try:
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores; "
              f"{args.rounds} interleaved rounds each")
        for stream in (False, True):
            measure(args.rounds, stream, server, proxy, client)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        client.close()
        proxy.close()
        server.stop()


if __name__ == "__main__":
    main()
