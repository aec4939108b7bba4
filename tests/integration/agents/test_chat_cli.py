"""``harbor-gym run --agent chat`` against the scripted policy server (SPEC GYM-13): rows and trajectories are
written, the same --seed sends the same requests, K rollouts get distinct per-call seeds, the key comes from the
environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harbor_gym.agents import ModelCall, full_requests
from harbor_gym.run.trajectories import read_trajectories

from agents_helpers import TEST_LABEL

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[3]


def run_cli(server, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HG_TEST_KEY": "sk-test-secret"}
    argv = [sys.executable, "-m", "harbor_gym.cli", "run", str(REPO / "envs" / "cake"), "--agent", "chat",
            "--model", "policy", "--base-url", server.url, "--api-key-env", "HG_TEST_KEY",
            "--agent-arg", "max_steps=5", "--agent-arg", "temperature=0.5", "--backend", "docker",
            "--label", "=".join(TEST_LABEL), "--out", str(out), "--seed", "3", "--save-trajectories", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)


def without_latency(call: dict) -> dict:
    return {k: v for k, v in call.items() if k != "latency_s"}


def test_cli_chat_writes_rows_and_trajectories_reproducibly(tmp_path, server, no_leaks):
    # SPEC: GYM-13 — rows and trajectories.jsonl; -k 4 gives 4 distinct per-call seeds; a rerun with the same
    # --seed gives identical model calls; the key reaches the server from the variable, not from argv.
    first = run_cli(server, tmp_path / "a", "-k", "4", "-c", "2")
    assert first.returncode in (0, 1), first.stdout + first.stderr
    rows = [json.loads(x) for x in (tmp_path / "a" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["rollout"] for r in rows) == [0, 1, 2, 3] and {r["agent"] for r in rows} == {"chat:policy"}
    lines = read_trajectories(tmp_path / "a")
    assert sorted(t["rollout"] for t in lines) == [0, 1, 2, 3]
    for line in lines:
        assert [t["step_name"] for t in line["turns"]] == ["01-select-cake-base", "02-select-frosting"]
        for turn in line["turns"]:
            calls = [ModelCall.from_dict(c) for c in turn["model_calls"]]
            assert calls and all(c.prompt_token_ids and c.logprobs for c in calls)
            assert full_requests(calls)[0][1]["role"] == "user"
            assert turn["outcome"]["status"] == "completed" and turn["outcome"]["model_calls"] == []
            assert calls[0].params["temperature"] == 0.5
    first_seeds = {line["turns"][0]["model_calls"][0]["seed"] for line in lines}
    assert len(first_seeds) == 4  # K rollouts, K distinct per-call seeds
    seeds = {c["seed"] for line in lines for t in line["turns"] for c in t["model_calls"]}
    ours = [auth for body, auth in zip(server.requests, server.auth) if body.get("seed") in seeds]
    assert len(ours) >= 8 and set(ours) == {"Bearer sk-test-secret"}  # from the variable, not from argv
    sent = len(server.requests)

    again = run_cli(server, tmp_path / "b", "-k", "1")
    assert again.returncode in (0, 1), again.stdout + again.stderr
    [rerun] = read_trajectories(tmp_path / "b")
    [original] = [t for t in lines if t["rollout"] == 0]
    for a, b in zip(original["turns"], rerun["turns"]):
        assert [without_latency(c) for c in a["model_calls"]] == [without_latency(c) for c in b["model_calls"]]
    rollout0 = {c["seed"] for t in original["turns"] for c in t["model_calls"]}
    assert [r for r in server.requests[sent:] if r.get("seed") in rollout0] == [
        r for r in server.requests[:sent] if r.get("seed") in rollout0]  # the same requests, byte for byte


def test_cli_help_lists_chat_and_refuses_a_key_argument(tmp_path):
    # SPEC: GYM-13 — --help names chat; an api_key given as --agent-arg is refused (exit 2, one line).
    helped = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "run", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert "chat" in helped.stdout and "--base-url" in helped.stdout and "--save-trajectories" in helped.stdout
    refused = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "run", str(REPO / "envs" / "cake"), "--agent",
                              "chat", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--agent-arg",
                              "api_key=sk-x", "--out", str(tmp_path / "o")],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
    assert refused.returncode == 2 and "api-key-env" in refused.stderr
