"""Model calls reach the caller from other processes (SPEC GYM-13, SES-3): Gymnasium's AsyncVectorEnv
(``shared_memory=False``) and HarborVectorEnv with Ray actors, against the scripted policy server."""

from __future__ import annotations

import json
import os

import gymnasium
import pytest

from harbor_gym import HarborEnv
from harbor_gym.agents import ChatAgent, full_requests, token_segments

from agents_helpers import DOCKER, chat_task
from policy_server import logprob, render, render_message

pytestmark = pytest.mark.docker


def assert_exactly_as_sent(records, requests):
    """Every call of every record holds exactly the tokens and logprobs the server computed for the request it
    matches (requests of concurrent envs interleave, so they are matched by their messages and seed)."""
    by_messages = {json.dumps([r["messages"], r["seed"]], sort_keys=True): r for r in requests}
    n = 0
    for record in records:
        assert record.model_calls, record
        for call, full in zip(record.model_calls, full_requests(record.model_calls)):
            body = by_messages[json.dumps([full, call.seed], sort_keys=True)]
            prompt = render(body["messages"]) + [3]
            assert call.prompt_token_ids == tuple(prompt)
            assistant = {"role": "assistant", "content": call.response_text,
                         "tool_calls": [{"function": {"name": c["name"], "arguments": c["arguments"]}}
                                        for c in call.tool_calls]}
            completion = render_message(assistant)[1:]
            assert call.completion_token_ids == tuple(completion)
            assert call.logprobs == tuple(logprob(len(prompt) + i, body["seed"]) for i in range(len(completion)))
            assert call.seed == body["seed"]
            n += 1
    return n


def turn_records(info, num_envs):
    records = info["turn"]
    return [records[i] for i in range(num_envs) if info["_turn"][i]]


def test_async_vector_env_brings_model_calls_back(tmp_path, server, no_leaks):
    # SPEC: GYM-13 — in AsyncVectorEnv worker processes (shared_memory=False) the records carry every call.
    task = chat_task(tmp_path)
    fns = [lambda: HarborEnv(task, config=DOCKER) for _ in range(2)]
    venv = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False)
    agent = ChatAgent("policy", server.url)
    try:
        venv.reset(seed=11)
        records = []
        for _ in range(2):
            _, reward, terminated, truncated, info = venv.step((agent, agent))
            assert reward.tolist() == [1.0, 1.0]
            records += turn_records(info, 2)
    finally:
        venv.close()
    assert len(records) == 4 and all(r.trainable for r in records)
    assert assert_exactly_as_sent(records, server.requests) == 14 == len(server.requests)
    seeds = {c.seed for r in records for c in r.model_calls}
    assert len(seeds) == 14  # per-call seeds differ across envs (reset seeds 11, 12), turns and calls


def test_async_vector_env_continues_the_session(tmp_path, server, no_leaks):
    # SPEC: SES-3, GYM-13 — a continued 3-turn session in a worker process: the pickled copy of the agent each step
    # is accepted as the announced agent, and the conversation (kept in turn.session) goes on.
    task = chat_task(tmp_path, steps=3)
    agent = ChatAgent("policy", server.url)
    fns = [lambda: HarborEnv(task, config={**DOCKER, "turn_sessions": "continue"}, agent=agent)]
    venv = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False)
    try:
        venv.reset(seed=3)
        records = []
        for _ in range(3):
            _, reward, _, _, info = venv.step((agent,))
            assert reward.tolist() == [1.0]
            records += turn_records(info, 1)
    finally:
        venv.close()
    assert [r.outcome.response.endswith(f"(users={i})") for i, r in enumerate(records, start=1)] == [True] * 3
    assert len(token_segments([c for r in records for c in r.model_calls])) == 1
    assert_exactly_as_sent(records, server.requests)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'harbor-gym[ray]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 * 1024,
             resources={"harbor_engine": 8})  # issue 17: this node has an engine (every actor/task asks for 1)
    yield ray
    ray.shutdown()


def test_ray_actors_bring_model_calls_back(ray_cluster, tmp_path, server, no_leaks):
    # SPEC: GYM-13 — HarborVectorEnv(executor="ray"): records cross as to_dict() and are rebuilt with their
    # outcome and model calls, token data exactly as sent.
    from harbor_gym.vector import HarborVectorEnv

    task = chat_task(tmp_path)
    venv = HarborVectorEnv(2, path=task, config=DOCKER, executor="ray", autoreset_mode="disabled")
    agent = ChatAgent("policy", server.url)
    try:
        venv.reset(seed=5)
        records = []
        for _ in range(2):
            _, reward, terminated, truncated, info = venv.step([agent, agent])
            assert reward.tolist() == [1.0, 1.0]
            records += turn_records(info, 2)
    finally:
        venv.close()
    assert len(records) == 4
    assert all(r.outcome is not None and r.outcome.response.startswith("done:") for r in records)
    assert assert_exactly_as_sent(records, server.requests) == 14
