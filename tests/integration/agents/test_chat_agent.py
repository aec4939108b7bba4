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


def test_text_mode_solves_the_task_with_fenced_commands(tmp_path, server, no_leaks):
    # SPEC: GYM-13 — tool_mode="text": commands in ```bash blocks, outputs back in one user message, no tools sent.
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    try:
        rewards, infos = run_episode(env, ChatAgent("policy-text", server.url, tool_mode="text"))
    finally:
        env.close()
    assert rewards == [1.0, 1.0]
    record = infos[0]["turn"]
    assert len(record.model_calls) == 4 and record.outcome.response.startswith("done: alpha")
    assert "tools" not in server.requests[0]
    assert "```bash" in server.requests[0]["messages"][0]["content"]  # the documented format is in the prompt
    roles = [m["role"] for m in server.requests[3]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert server.requests[3]["messages"][-1]["content"].startswith("Output of command 1:\n[exit code 0]\nalpha")


def test_continued_session_keeps_the_conversation_over_three_turns(tmp_path, server, no_leaks):
    # SPEC: SES-3, GYM-13 — turn_sessions="continue": turn 3's first request holds turns 1-2's whole conversation;
    # each record holds its own activation's calls, the first stored whole.
    env = HarborEnv(chat_task(tmp_path, steps=3), config={**DOCKER, "turn_sessions": "continue"})
    agent = ChatAgent("policy", server.url)
    try:
        env.reset(seed=1, options={"agent": agent})
        records = []
        for _ in range(3):
            _, reward, terminated, truncated, info = env.step(agent)
            assert reward == 1.0
            records.append(info["turn"])
    finally:
        env.close()
    assert terminated
    assert [r.outcome.response for r in records] == ["done: alpha (users=1)", "done: beta (users=2)",
                                                     "done:  (users=3)"]
    assert [len(r.model_calls) for r in records] == [4, 3, 2]
    turn2 = full_requests(records[1].model_calls)
    turn3 = full_requests(records[2].model_calls)
    assert records[2].model_calls[0].messages_offset == 0
    assert turn3[0][:len(turn2[-1])] == turn2[-1]  # the conversation goes on
    assert [m["role"] for m in turn3[0]].count("user") == 3 and turn3[0][0]["role"] == "system"
    # one continued conversation: the token segments of turn 3 extend turn 2's
    segments = token_segments([*records[0].model_calls, *records[1].model_calls, *records[2].model_calls])
    assert len(segments) == 1


def test_a_server_refusing_logprobs_gives_calls_without_tokens(tmp_path, server, no_leaks):
    # SPEC: GYM-13 — a 400 naming a token option: resent once without it, remembered for the endpoint; the calls
    # hold None token data (never re-tokenised) and the turn still succeeds.
    RefusedOptions.forget()
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    try:
        rewards, infos = run_episode(env, ChatAgent("policy-nologprobs", server.url))
    finally:
        env.close()
        RefusedOptions.forget()
    assert rewards == [1.0, 1.0]
    calls = [c for i in infos for c in i["turn"].model_calls]
    assert len(calls) == 7
    assert all(c.prompt_token_ids is None and c.completion_token_ids is None and c.logprobs is None for c in calls)
    refused = [r for r in server.requests if r.get("logprobs") or r.get("return_token_ids")]
    # the first request carried both options and was refused once per named option, then never again
    assert len(refused) <= 3 and server.requests.index(refused[-1]) < 3
    assert len(server.requests) == len(calls) + len(refused)
    assert token_segments(calls) == []


def test_a_server_that_is_down_gives_the_pinned_error(tmp_path, server, no_leaks):
    # SPEC: GYM-13, STOP-6 — connection refused: status error, policy retry, failure_kind
    # harbor_gym:model_unreachable naming the URL, after the client's bounded retries; never trainable.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    try:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(ChatAgent("policy", dead, max_retries=2))
    finally:
        env.close()
    record = info["turn"]
    assert record.failure_kind == "harbor_gym:model_unreachable"
    assert dead in record.failure_message and dead in record.outcome.output_tail
    assert record.agent_status == "error" and record.outcome.policy.value == "retry"
    assert record.trainable is False and not getattr(record, "agent_caused", False)
    assert info["episode_result"].retryable and not info["episode_result"].graded
    assert reward == 0.0 and (terminated or truncated)
    assert record.model_calls == ()
    assert record.timings["agent"] < 30  # bounded retries (the client's 2, with its backoff), not a hang


def test_a_model_that_never_stops_is_cut_at_max_steps(tmp_path, server, no_leaks):
    # SPEC: GYM-13, GYM-5 — max_steps bounds the model calls of one activation.
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(ChatAgent("policy-loop", server.url, max_steps=3))
    finally:
        env.close()
    record = info["turn"]
    assert len(record.model_calls) == 3 and len(server.requests) == 3
    assert record.outcome.metadata["stop_reason"] == "max_steps" and record.agent_status == "completed"
    assert record.reward == 0.0 and record.trainable


def test_a_model_that_never_stops_is_cut_at_the_turn_budget(tmp_path, server, no_leaks):
    # SPEC: GYM-13, BUD-1, GYM-5 — a 1 s/answer model with no step bound ends when the turn's 4 s budget ends:
    # status timeout (graded), the calls made so far kept.
    env = HarborEnv(chat_task(tmp_path, agent_timeout=4), config=DOCKER)
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(ChatAgent("policy-slow", server.url, max_steps=1000))
    finally:
        env.close()
    record = info["turn"]
    assert record.agent_status == "timeout" and record.reward == 0.0
    assert record.outcome.metadata.get("stop_reason", "time") == "time"  # its own stop, or the engine's overrun
    assert 1 <= len(record.model_calls) <= 5
    assert record.timings["agent"] < 4 + 3  # the budget, plus the last request's bound and the join grace


def test_streamed_answers_give_the_same_model_calls(tmp_path, server, no_leaks):
    # SPEC: GYM-13 — stream=True: chunks joined, prompt_token_ids of the first chunk, token_ids and logprobs of every
    # chunk concatenated, exactly the data of the unstreamed answer.
    env = HarborEnv(chat_task(tmp_path), config=DOCKER)
    try:
        rewards, infos = run_episode(env, ChatAgent("policy", server.url, stream=True))
    finally:
        env.close()
    assert rewards == [1.0, 1.0]
    assert all(r["stream"] is True and r["stream_options"] == {"include_usage": True} for r in server.requests)
    records = [i["turn"] for i in infos]
    check_calls_as_sent(records[0], server.requests[:4])
    check_calls_as_sent(records[1], server.requests[4:])
    assert records[0].model_calls[0].tool_calls[0]["arguments"] == '{"command": "echo alpha > /app/a.txt"}'
    assert records[0].model_calls[-1].finish_reason == "stop"
