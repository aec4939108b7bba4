"""The episode's side of the capture proxy without Docker (issue 18 items 2 and 4): the variables an activation
gets and their names, the exec wrapper that carries them, windows and refused counts over a fake session, the
config refusal of an allowlisted key variable. Real episodes: tests/integration/agents/test_capture_episode.py."""

from types import SimpleNamespace

import pytest

from harbor_gym.config import EnvConfig, ModelEnvNames
from harbor_gym.episode._proxy import EpisodeProxy, ProxyEnvExec, activation_env
from harbor_gym.errors import ConfigError
from harbor_gym.proxy import ModelUpstream


class FakeSession:
    token = "tok-secret"

    def __init__(self):
        self.log, self.refused_outside, self.closed = [], 0, False

    def base_url_for(self, address):
        return f"http://{address}/v1"

    def anthropic_base_url_for(self, address):
        return f"http://{address}"

    def begin_activation(self, index):
        self.log.append(("begin", index))

    def end_activation(self):
        self.log.append(("end",))
        return SimpleNamespace(calls=["c1", "c2"], refused_over_cap=1, refused_outside=99)

    def close(self):
        self.closed = True


# issue 18 item 2: the default names, the OpenAI base with /v1, the Anthropic base without, the token as both keys
def test_issue18_activation_env_default_and_configured_names():
    env = activation_env(ModelEnvNames(), openai_base_url="http://10.1.2.3:4000/v1",
                         anthropic_base_url="http://10.1.2.3:4000", token="t")
    assert env == {"OPENAI_BASE_URL": "http://10.1.2.3:4000/v1", "ANTHROPIC_BASE_URL": "http://10.1.2.3:4000",
                   "OPENAI_API_KEY": "t", "ANTHROPIC_API_KEY": "t"}
    names = ModelEnvNames(openai_base_url="MY_URL", anthropic_base_url=None, anthropic_api_key=None)
    assert activation_env(names, openai_base_url="http://a:1/v1", anthropic_base_url="http://a:1", token="t") == {
        "MY_URL": "http://a:1/v1", "OPENAI_API_KEY": "t"}
    with pytest.raises(ValueError, match="differ"):
        ModelEnvNames(openai_api_key="X", anthropic_api_key="X")
    with pytest.raises(ValueError):
        ModelEnvNames(openai_base_url="not a name")


# issue 18 item 2: the variables go under each command's env (the agent's own env wins); the repr hides them
def test_issue18_proxy_env_exec_lays_variables_under_and_hides_them():
    seen = []
    wrapped = ProxyEnvExec(lambda cmd, **kw: seen.append((cmd, kw)) or "res", {"OPENAI_API_KEY": "tok-secret",
                                                                              "OPENAI_BASE_URL": "u"})
    assert wrapped("true", env={"OPENAI_BASE_URL": "mine", "X": "1"}, timeout=3) == "res"
    assert seen == [("true", {"env": {"OPENAI_API_KEY": "tok-secret", "OPENAI_BASE_URL": "mine", "X": "1"},
                              "timeout": 3})]
    assert "tok-secret" not in repr(wrapped)


# issue 18: a window's calls and refusals; refusals outside windows counted per turn span; close ends an open window
def test_issue18_windows_and_refused_counts_per_span():
    session = FakeSession()
    proxy = EpisodeProxy(session, 4000, ModelEnvNames())
    assert proxy.end() == ((), 0)  # no window open: nothing asked of the session
    proxy.begin(0)
    assert proxy.end() == (("c1", "c2"), 1)
    session.refused_outside = 3
    assert proxy.refused_since_last() == 3
    assert proxy.refused_since_last() == 0
    session.refused_outside = 5
    assert proxy.refused_since_last() == 2
    proxy.begin(1)
    proxy.close()
    proxy.close()
    assert session.closed and session.log == [("begin", 0), ("end",), ("begin", 1), ("end",)]
    assert proxy.env_for(None) == {}
    assert proxy.env_for("1.2.3.4:4000")["OPENAI_BASE_URL"] == "http://1.2.3.4:4000/v1"


# issue 18 item 2: no task can read the upstream's key: an allowlist naming its variable is refused, naming both
def test_issue18_allowlisted_upstream_key_refused():
    upstream = {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "POLICY_KEY"}
    with pytest.raises(ConfigError, match=r"host_env_allowlist.*model_upstream\.api_key_env"):
        EnvConfig.coerce({"model_upstream": upstream, "host_env_allowlist": ["HOME", "POLICY_KEY"]})
    with pytest.raises(ValueError, match="host_env_allowlist"):
        EnvConfig(model_upstream=ModelUpstream(**upstream), host_env_allowlist=("POLICY_KEY",))
    ok = EnvConfig.coerce({"model_upstream": upstream, "host_env_allowlist": ["HOME"]})
    assert ok.model_upstream.api_key_env == "POLICY_KEY"
    assert EnvConfig.coerce(ok.model_dump(mode="json")) == ok  # JSON round trip (gym.make, EnvSpec.to_json)


# issue 18 item 2: through both paths a task could read a host variable — FMT-15 templates and compose
# interpolation — the key's variable stays unread under a config with an upstream (its allowlist cannot name it)
def test_issue18_upstream_key_unreadable_by_templates_and_compose(tmp_path, monkeypatch):
    import warnings

    from harbor_gym.episode._spec import resolved_env
    from harbor_gym.errors import SeedRefusedError
    from harbor_gym.task import load_task

    monkeypatch.setenv("POLICY_KEY", "sk-upstream-secret")
    config = EnvConfig.coerce({"model_upstream": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "POLICY_KEY"},
                               "host_env_allowlist": ["HOME"]})
    root = tmp_path / "t"
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    image: debian:bookworm-slim\n    environment:\n"
        "      SEEN: ${POLICY_KEY:-none}\n      BARE: ${POLICY_KEY}\n")
    (root / "task.toml").write_text('schema_version = "1.4"\n[environment]\nnetwork_mode = "no-network"\n'
                                    'env = { K = "${POLICY_KEY:-unset}" }\n')
    (root / "instruction.md").write_text("x\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unset ${POLICY_KEY} is warned about, then empty
        task = load_task(root, config)
    assert task.compose.main.env == {"SEEN": "none", "BARE": ""}  # compose interpolation: never the key
    allow = config.host_env_allowlist
    assert resolved_env(task.config.environment.env, where="environment.env", allowlist=allow) == {"K": "unset"}
    with pytest.raises(SeedRefusedError, match="POLICY_KEY"):  # FMT-15 without a default: LOAD-23, not the key
        resolved_env({"K": "${POLICY_KEY}"}, where="environment.env", allowlist=allow)


# issue 18 item 2: where sandboxes have no route to a host service, an episode with an upstream is refused at seed,
# naming why, before any sandbox starts and before any proxy session opens (real refusals: tests/hostile's
# host-route tests and netguard's listen_addresses)
def test_issue18_no_route_refused_at_seed_before_any_sandbox(tmp_path, monkeypatch):
    from harbor_gym.episode import Episode
    from harbor_gym.errors import SandboxUnavailableError, SeedRefusedError
    from harbor_gym.sandbox import host_route

    def no_route(backend):
        raise SandboxUnavailableError("no route from docker sandboxes to a host service here: the engine is "
                                      "rootless", field="host_service_port", rule="GYM-10")

    def never(*args, **kwargs):
        raise AssertionError("nothing may start after the refusal")

    monkeypatch.setattr(host_route, "listen_addresses", no_route)
    monkeypatch.setattr("harbor_gym.proxy.shared_proxy", never)
    root = tmp_path / "t"
    (root / "tests").mkdir(parents=True)
    (root / "task.toml").write_text('schema_version = "1.4"\n[environment]\ndocker_image = "debian:bookworm-slim"\n'
                                    'network_mode = "no-network"\n')
    (root / "instruction.md").write_text("x\n")
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    config = {"backend": "docker", "model_upstream": {"base_url": "http://127.0.0.1:9/v1"}}
    episode = Episode(root, config=config, sandbox_factory=never)
    with pytest.raises(SeedRefusedError, match="rootless") as caught:
        episode.start()
    assert caught.value.field == "EnvConfig.model_upstream"
    episode.close()


# GYM-13 / issue 18: the proxy's calls and the refused count are plain data: they pickle and survive the vector
# envs' and Ray's to_dict round trip (harbor_gym.vector._subenv)
def test_issue18_records_with_proxy_calls_cross_processes():
    import pickle

    from harbor_gym.agents import ModelCall
    from harbor_gym.episode import TurnRecord
    from harbor_gym.vector._subenv import info_from_plain, info_to_plain

    call = ModelCall(request_messages=({"role": "user", "content": "x"},), prompt_token_ids=(1, 2), logprobs=(-0.5,),
                     completion_token_ids=(7,), status="cancelled", stream=True, error="cancelled: window ended")
    record = TurnRecord(task_id="t", step_name="s", index=0, instruction="x", reward=1, verifier_rewards={},
                        reward_valid=True, masked=False, verifier_mode="shared", failure_kind=None,
                        min_reward_missed=False, agent_status="completed", exit_code=0, output_tail="",
                        model_calls=(call,), model_calls_refused=2)
    assert pickle.loads(pickle.dumps(record)) == record
    back = info_from_plain(info_to_plain({"turn": record}))["turn"]
    assert back == record and back.model_calls_refused == 2 and back.model_calls[0].status == "cancelled"
