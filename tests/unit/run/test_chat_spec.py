"""``--agent chat`` and ``--agent-arg`` resolution, and the trajectories file (SPEC GYM-13)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from harbor_gym.agents import AgentOutcome, ChatAgent, ModelCall
from harbor_gym.errors import ConfigError
from harbor_gym.run.agents import parse_agent_args, resolve_agent
from harbor_gym.run.trajectories import TrajectoryWriter, read_trajectories


def test_agent_args_are_json_when_they_parse():
    assert parse_agent_args(["a=3", "b=0.5", "c=true", "d=text", 'e={"k": 1}', "f="]) == {
        "a": 3, "b": 0.5, "c": True, "d": "text", "e": {"k": 1}, "f": ""}
    for bad in (["novalue"], ["=x"], ["a-b=1"]):
        with pytest.raises(ConfigError):
            parse_agent_args(bad)


def test_chat_spec_makes_a_chat_agent_per_episode():
    # SPEC: GYM-13 — chat needs model and base_url; the key is never an argument; each episode a fresh agent.
    spec = resolve_agent("chat", {"model": "m", "base_url": "http://127.0.0.1:1/v1", "max_steps": 3,
                                  "api_key_env": "MY_KEY"})
    a, b = spec.new(), spec.new()
    assert isinstance(a.announced, ChatAgent) and a.announced is not b.announced
    assert a.announced.max_steps == 3 and a.announced.api_key_env == "MY_KEY" and spec.label == "chat:m"
    assert a.action_for("s") is a.announced
    with pytest.raises(ConfigError, match="--base-url"):
        resolve_agent("chat", {"model": "m"})
    with pytest.raises(ConfigError, match="api-key-env"):
        resolve_agent("chat", {"model": "m", "base_url": "u", "api_key": "sk-x"})
    with pytest.raises(ConfigError, match="tool_mode"):
        resolve_agent("chat", {"model": "m", "base_url": "u", "tool_mode": "nope"})
    with pytest.raises(ConfigError, match="takes no --agent-arg"):
        resolve_agent("oracle", {"x": 1})


def test_chat_agent_pickles_without_its_client_and_compares_by_settings():
    # SPEC: GYM-13, SES-3 — the client is made lazily and never pickled; a copy equals the original.
    agent = ChatAgent("m", "http://127.0.0.1:1/v1", api_key="sk-secret")
    agent._client()
    copy = pickle.loads(pickle.dumps(agent))
    assert copy == agent and copy._client_obj is None and hash(copy) == hash(agent)
    assert "sk-secret" not in repr(agent)
    assert ChatAgent("m", "http://127.0.0.1:1/v1", max_steps=2) != agent


def test_trajectory_writer_lines(tmp_path):
    # SPEC: GYM-13 — one line per episode with each turn's outcome and model calls.
    call = ModelCall(request_messages=[{"role": "user", "content": "x"}], prompt_token_ids=[1], seed=4)
    record = SimpleNamespace(step_name="s", index=0, reward=1.0, trainable=True, failure_kind=None,
                             outcome=AgentOutcome(response="r"), model_calls=(call,))
    writer = TrajectoryWriter(tmp_path)
    writer.write([record], task_id="t", rollout=0, seed=9, attempt=1, agent="chat:m")
    [line] = read_trajectories(tmp_path)
    assert line["task_id"] == "t" and line["turns"][0]["outcome"]["response"] == "r"
    assert ModelCall.from_dict(line["turns"][0]["model_calls"][0]) == call
