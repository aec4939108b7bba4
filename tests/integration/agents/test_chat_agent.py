"""`ChatAgent` against a real HTTP policy server, on real Docker (SPEC GYM-13, GYM-4/5, SES-2/3): a 2-turn task
solved with several commands per turn, token data exactly as sent, the edge cases of the issue."""

from __future__ import annotations

import json

import pytest

from harbor_gym import HarborEnv
from harbor_gym.agents import ChatAgent, full_requests, token_segments
from harbor_gym.agents._chat_wire import RefusedOptions

from agents_helpers import DOCKER, chat_task
from policy_server import logprob, render, render_message

pytestmark = pytest.mark.docker


def run_episode(env, agent, seed=7):
    env.reset(seed=seed)
    infos, rewards, done = [], [], False
    while not done:
        _, reward, terminated, truncated, info = env.step(agent)
        infos.append(info)
        rewards.append(reward)
        done = terminated or truncated
    return rewards, infos


def check_calls_as_sent(record, requests, seed_used=True):
    """Every call of ``record`` holds the tokens and logprobs the server computed for its request, exactly."""
    fulls = full_requests(record.model_calls)
    assert len(fulls) == len(requests)
    for call, full, body in zip(record.model_calls, fulls, requests):
        assert full == body["messages"]  # the delta rebuilds the request sent
        prompt = render(body["messages"]) + [3]
        assert call.prompt_token_ids == tuple(prompt)
        assistant = {"role": "assistant", "content": call.response_text,
                     "tool_calls": [{"function": {"name": c["name"], "arguments": c["arguments"]}}
                                    for c in call.tool_calls]}
        completion = render_message(assistant)[1:]
        assert call.completion_token_ids == tuple(completion)
        assert call.logprobs == tuple(logprob(len(prompt) + i, body.get("seed")) for i in range(len(completion)))
        assert call.seed == body.get("seed") and (call.seed is not None) == seed_used
        assert call.usage["completion_tokens"] == len(completion)
        assert call.latency_s > 0


def test_two_turn_task_solved_with_several_commands_per_turn(tmp_path, server, no_leaks):
    # SPEC: GYM-13, GYM-4 — ChatAgent solves a 2-turn task issuing several commands per turn, reads their outputs,
    # stops; info["turn"] carries the outcome and every model call's tokens/logprobs exactly as the server sent them.
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    agent = ChatAgent("policy", server.url)
    try:
        rewards, infos = run_episode(env, agent)
    finally:
        env.close()
    assert rewards == [1.0, 1.0]
    records = [i["turn"] for i in infos]
    assert [len(r.model_calls) for r in records] == [4, 3]  # 3 + 2 commands, then the answer
    assert records[0].outcome.response == "done: alpha (users=1)"  # it read cat's output
    assert records[1].outcome.response == "done: beta (users=1)"  # fresh: a clean conversation per turn
    assert records[0].outcome.status.value == "completed" and records[0].outcome.metadata["stop_reason"] == "answer"
    assert all(r.trainable for r in records)
    # the request shape: the bash tool first, token options asked for, tool results as role "tool", no user
    # messages between calls
    first = server.requests[0]
    assert first["tools"][0]["function"]["name"] == "bash"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["command"]
    assert first["logprobs"] is True and first["return_token_ids"] is True
    last = server.requests[3]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                         "tool"]
    assert last[-1]["content"].startswith("[exit code 0]\nalpha")
    check_calls_as_sent(records[0], server.requests[:4])
    check_calls_as_sent(records[1], server.requests[4:])
    # the ATIF trajectory of the outcome names the tool calls and their outputs
    steps = records[0].outcome.trajectory
    assert steps[0]["tool_calls"][0]["arguments"] == {"command": "echo alpha > /app/a.txt"}
    assert steps[-1]["message"] == "done: alpha (users=1)"
    # one token segment per turn: mask 1 exactly on the completion tokens
    for record in records:
        segments = token_segments(record.model_calls)
        assert len(segments) == 1
        seg = segments[0]
        completion = [t for c in record.model_calls for t in c.completion_token_ids]
        assert [t for t, m in zip(seg.token_ids, seg.loss_mask) if m == 1] == completion
        assert sum(seg.loss_mask) == len(completion)
        assert [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m] == [
            lp for c in record.model_calls for lp in c.logprobs]
    # the record survives JSON (the Ray path) as the same data
    from harbor_gym.episode import TurnRecord

    again = TurnRecord(**json.loads(json.dumps(records[0].to_dict())))
    assert again.model_calls == records[0].model_calls and again.outcome == records[0].outcome
