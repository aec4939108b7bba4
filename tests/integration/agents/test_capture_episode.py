"""Installed harnesses in real episodes (issue 18): a harness inside a no-network sandbox calls its model through
the episode's capture proxy, and what it sent and got lands in the turn records (SPEC GYM-13), on Docker, on the
local backend (bubblewrap) and on a compose task; refusals, concurrency, budgets and the CLI.

The harness is tests/integration/agents/harness.py (python3 and its standard library, run in the sandbox by
`CommandAgent`); the upstream is the scripted policy server of these tests (vLLM's answer shape).
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harbor_gym.agents import CommandAgent, ModelCall, full_requests
from harbor_gym.episode import Episode
from harbor_gym.run.trajectories import read_trajectories

from agents_helpers import DOCKER, TEST_LABEL
from policy_server import logprob, render, render_message
from task_folders import grade, toml, write_task

HARNESS = (Path(__file__).parent / "harness.py").read_text()
AGENT = CommandAgent("python3 /app/agent.py {instruction}")
INLINE = CommandAgent(f"python3 -c {shlex.quote(HARNESS)} {{instruction}}")  # no file needed in the image
HOST_KEY = "sk-host-upstream-key-never-in-a-sandbox"
REPO = Path(__file__).resolve().parents[3]


def task(root: Path, name: str, steps: dict[str, tuple[str, str]], *, agent_timeout: float = 60,
         files: dict | None = None) -> Path:
    """A no-network task whose steps are ``{name: (instruction, verifier check)}``; the harness is copied into the
    workdir as /app/agent.py (FMT-10)."""
    spec = {"task.toml": toml(list(steps), agent_timeout=agent_timeout), "environment/agent.py": HARNESS,
            **(files or {})}
    for step, (instruction, check) in steps.items():
        spec[f"steps/{step}/instruction.md"] = instruction
        spec[f"steps/{step}/tests/test.sh"] = grade(check)
    return write_task(root, spec, name)


def upstream_config(url: str, **extra) -> dict:
    return {**DOCKER, "model_upstream": {"base_url": url, "api_key_env": "HG_TEST_UPSTREAM_KEY"}, **extra}


def assert_calls_are_the_upstreams(calls, requests) -> None:
    """GYM-13: each recorded call is the request the upstream got (messages rebuilt from the deltas) and the token
    ids and logprobs it answered with (the policy server's toy tokenizer and logprob function)."""
    assert len(calls) == len(requests)
    for call, messages, body in zip(calls, full_requests(calls), requests):
        assert messages == body["messages"]
        prompt = render(body["messages"]) + [3]
        assistant = {"role": "assistant", "content": call.response_text, "tool_calls": [
            {"function": {"name": c["name"], "arguments": c["arguments"]}} for c in call.tool_calls]}
        assert call.prompt_token_ids == tuple(prompt)
        assert call.completion_token_ids == tuple(render_message(assistant)[1:])
        assert call.logprobs == tuple(logprob(len(prompt) + i, body.get("seed"))
                                      for i in range(len(call.completion_token_ids)))
        assert call.status == "ok" and call.api == "openai"


def wait_for(probe, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def host_listener():
    """A host service on 0.0.0.0 at another port: no sandbox may reach it (GYM-10)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.mark.docker
def test_issue18_harness_in_no_network_sandbox_is_captured(tmp_path, server, no_leaks, monkeypatch, host_listener,
                                                           docker_client):
    # issue 18 items 1-3: a no-network task; the harness calls the model through OPENAI_BASE_URL, runs what it says;
    # the verifier gives 1.0; the turn's model_calls hold the upstream's token ids and logprobs; a streamed call is
    # recorded whole; a forged token gets 401; only the proxy's port is reachable; a call from a process left
    # running between turns is refused and counted on the next turn's record, never recorded; the upstream's key
    # (a host variable) reaches the upstream and never the sandbox.
    monkeypatch.setenv("HG_TEST_UPSTREAM_KEY", HOST_KEY)
    path = task(tmp_path, "harnessed", {
        "s1": ("Make /app/a.txt hold alpha.\n$ echo alpha > /app/a.txt\n"
               f"$ python3 /app/agent.py probe {host_listener}\n"
               "$ nohup python3 /app/agent.py leftover > /dev/null 2>&1 &\n", '[ "$(cat /app/a.txt)" = alpha ]'),
        "s2": ("[stream] Append beta.\n$ echo beta >> /app/a.txt\n", '[ "$(sed -n 2p /app/a.txt)" = beta ]'),
    })
    with Episode(path, config=upstream_config(server.url), agent=AGENT) as episode:
        episode.start()
        first = episode.run_turn(AGENT).record
        sb = episode.sandbox
        probe = json.loads(sb.read_file("/tmp/probe.json", max_bytes=4096))
        container_env = docker_client.containers.get(sb.name).attrs["Config"]["Env"]
        sb.exec(["touch", "/tmp/go"], timeout=30, user="root")  # the leftover calls now, between turns
        leftover = wait_for(lambda: sb.read_file("/tmp/leftover.txt", max_bytes=100), "the leftover's call")
        environ = sb.exec(["sh", "-c", "cat /proc/[0-9]*/environ | tr '\\0' '\\n'"], timeout=30, user="root")
        second = episode.run_turn(AGENT).record
    assert (first.reward, second.reward) == (1, 1), (first.output_tail, second.output_tail)
    assert len(first.model_calls) == 4 and len(second.model_calls) == 2  # a call per command, then the answer
    assert_calls_are_the_upstreams(first.model_calls + second.model_calls, server.requests)
    assert not any(c.stream for c in first.model_calls) and all(c.stream for c in second.model_calls)
    assert second.model_calls[-1].finish_reason == "stop" and second.model_calls[0].tool_calls  # streamed, whole
    assert probe == {"proxy_port": True, "gateway_other_port": False, "outside": False, "forged_token": 401}
    assert leftover == b"403" and (first.model_calls_refused, second.model_calls_refused) == (0, 1)
    assert not any(m["content"] == "leftover" for r in server.requests for m in r["messages"])  # never forwarded
    assert set(server.auth) == {f"Bearer {HOST_KEY}"}  # the upstream got the host's key ...
    assert HOST_KEY not in environ.stdout and HOST_KEY not in json.dumps(first.to_dict())  # ... no sandbox did
    # per activation, not per container: the token is in no container-level variable (setup.sh and verifiers
    # never see it)
    assert not any(v.startswith(("OPENAI_", "ANTHROPIC_")) for v in container_env)


class HangingUpstream:
    """An upstream that starts a streamed answer and never ends it; ``closed`` is set once the proxy hung up."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "policy",
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "par"}}]}
                try:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    for _ in range(3000):  # 10 minutes at most
                        time.sleep(0.2)
                        self.wfile.write(b": still thinking\n\n")
                        self.wfile.flush()
                except OSError:
                    outer.closed.set()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.docker
def test_issue18_call_in_flight_at_budget_is_cancelled(tmp_path, no_leaks):
    # issue 18 item 4: a turn past its agent budget is cut with a model call in flight: the call is cancelled
    # upstream and recorded `cancelled`, and the turn ends within its budget plus grace. The harness runs in a
    # session of its own, so the budget's kill of the command's process group leaves it connected: only the end
    # of the activation window can cut its call.
    hanging = HangingUpstream()
    detached = CommandAgent("setsid python3 /app/agent.py {instruction} > /tmp/harness.log 2>&1 & wait")
    try:
        path = task(tmp_path, "hangs", {"s1": ("[stream] think forever", "true"), "s2": ("unused", "true")},
                    agent_timeout=4)  # two steps: the sandbox outlives turn 1
        with Episode(path, config=upstream_config(hanging.url), agent=detached) as episode:
            episode.start()
            record = episode.run_turn(detached).record
            sb = episode.sandbox
            # the harness outlived the budget, still connected, and got the proxy's answer to the cut call
            log = wait_for(lambda: sb.read_file("/tmp/harness.log", max_bytes=65536), "the harness's log", 30)
            assert b"par" in log  # what arrived before the cut reached it
        assert record.agent_status == "timeout"
        [call] = record.model_calls
        assert call.status == "cancelled" and call.stream, call
        assert "activation window ended" in call.error  # cut by the window's end, not by the harness leaving
        assert record.timings["agent"] < 4 + 30  # the budget, plus a generous grace for a loaded engine
        assert hanging.closed.wait(30), "the upstream call was not closed"
    finally:
        hanging.stop()


@pytest.mark.docker
def test_issue18_concurrent_episodes_never_mix_records(tmp_path, server, no_leaks):
    # issue 18 item 2: each episode has its own session token; two episodes at once keep their own calls.
    words = ("alpha", "gamma")
    paths = [task(tmp_path, f"t-{w}", {"s1": (f"Write {w}.\n$ echo {w} > /app/w.txt\n",
                                              f'[ "$(cat /app/w.txt)" = {w} ]')}) for w in words]
    records: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(word: str, path: Path) -> None:
        try:
            with Episode(path, config=upstream_config(server.url), agent=AGENT) as episode:
                episode.start()
                records[word] = episode.run_turn(AGENT).record
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w, p)) for w, p in zip(words, paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for word, other in (words, words[::-1]):
        record = records[word]
        assert record.reward == 1 and len(record.model_calls) == 2
        text = json.dumps([c.to_dict() for c in record.model_calls])
        assert word in text and other not in text
    assert len(server.requests) == 4


@pytest.mark.bwrap
def test_issue18_harness_on_local_backend(tmp_path, server):
    # issue 18 item 2: the same harness on the local backend (bubblewrap): the route, the calls, the reward; and a
    # call in Anthropic's protocol through ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY, recorded with the upstream's ids.
    path = task(tmp_path, "local", {"s1": ("Write alpha.\n$ echo alpha > /app/w.txt\n$ python3 /app/agent.py "
                                           "anthropic\n", '[ "$(cat /app/w.txt)" = alpha ]')})
    with Episode(path, config={**upstream_config(server.url), "backend": "local"}, agent=AGENT) as episode:
        episode.start()
        record = episode.run_turn(AGENT).record
    assert record.reward == 1, record.output_tail
    assert [c.api for c in record.model_calls] == ["openai", "openai", "anthropic", "openai"]
    openai = [i for i, c in enumerate(record.model_calls) if c.api == "openai"]
    assert_calls_are_the_upstreams([record.model_calls[i] for i in openai], [server.requests[i] for i in openai])
    claude = record.model_calls[2]
    assert claude.status == "ok" and claude.prompt_token_ids == tuple(render(server.requests[2]["messages"]) + [3])
    assert claude.logprobs and len(claude.logprobs) == len(claude.completion_token_ids)


@pytest.mark.docker
def test_issue18_harness_on_compose_main(tmp_path, server, no_leaks):
    # issue 18 item 2: a compose task: service main (with a sidecar beside it) reaches the proxy.
    compose = ("services:\n  main:\n    image: debian:bookworm-slim\n"
               "  side:\n    image: debian:bookworm-slim\n    command: [sleep, infinity]\n")
    files = {"task.toml": toml(["s1"], agent_timeout=60).replace('docker_image = "debian:bookworm-slim"\n', ""),
             "environment/docker-compose.yaml": compose,
             "steps/s1/instruction.md": "Write alpha.\n$ echo alpha > /app/w.txt\n",
             "steps/s1/tests/test.sh": grade('[ "$(cat /app/w.txt)" = alpha ]')}
    path = write_task(tmp_path, files, "composed")
    with Episode(path, config=upstream_config(server.url), agent=INLINE) as episode:
        episode.start()
        record = episode.run_turn(INLINE).record
    assert record.reward == 1, record.output_tail
    assert_calls_are_the_upstreams(record.model_calls, server.requests)


@pytest.mark.docker
def test_issue18_cli_cmd_agent_writes_rows_with_model_calls(tmp_path, server, no_leaks):
    # issue 18 item 3: `harbor-gym run --agent cmd:"..." --base-url URL` captures the harness's calls: rows name
    # the agent and count its calls, trajectories hold them (token ids, logprobs); --help lists cmd:.
    helped = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "run", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert "cmd:" in helped.stdout
    path = task(tmp_path, "cli", {"s1": ("Write alpha.\n$ echo alpha > /app/w.txt\n",
                                         '[ "$(cat /app/w.txt)" = alpha ]')})
    spec = "cmd:python3 /app/agent.py {instruction}"
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "harbor_gym.cli", "run", str(path), "--agent", spec, "--base-url", server.url,
            "--api-key-env", "HG_TEST_UPSTREAM_KEY", "--backend", "docker", "--label", "=".join(TEST_LABEL),
            "--out", str(out), "--save-trajectories"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "HG_TEST_UPSTREAM_KEY": HOST_KEY})
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert row["agent"] == spec and row["reward"] == 1
    assert row["turns"][0]["model_calls"] == 2 and row["turns"][0]["model_calls_refused"] == 0
    [line] = read_trajectories(out)
    calls = [ModelCall.from_dict(c) for c in line["turns"][0]["model_calls"]]
    assert_calls_are_the_upstreams(calls, server.requests)
    assert set(server.auth) == {f"Bearer {HOST_KEY}"}
    assert not any(HOST_KEY in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
