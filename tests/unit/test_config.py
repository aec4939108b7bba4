"""EnvConfig: one frozen, JSON-serialisable settings object; host settings by explicit configuration only."""

from __future__ import annotations

import json

import pytest

from harbor_gym import ConfigError, EnvConfig
from harbor_gym.config import PullPolicy, Semantics, host_settings


def test_defaults_are_the_spec_defaults():
    config = EnvConfig()
    assert config.semantics is Semantics.SEED  # SPEC: §0 (Seed is the default)
    assert config.turn_sessions.value == "fresh"  # SPEC: SES-1
    assert config.seed_retries == 2  # SPEC: GYM-2
    assert config.deadline_clock.value == "env"  # SPEC: BUD-6
    assert config.enforce_task_timeouts is True  # SPEC: BUD-6
    assert config.default_episode_timeout_seconds == 21_600  # SPEC: BUD-6
    assert config.verifier_grace_s == 30.0  # SPEC: §15.3 (provisional)
    assert config.step_setup_timeout_s is None  # SPEC: BUD-4
    assert config.separate_verifier_for_artifacts is False  # SPEC: VER-2


def test_json_round_trip_and_dict_coercion():
    config = EnvConfig.coerce({"semantics": "harbor", "verifier_grace_s": 5, "image_aliases": {"a:1": "b"}})
    text = config.model_dump_json()
    assert json.loads(text)["semantics"] == "harbor"
    assert EnvConfig.model_validate_json(text) == config
    assert EnvConfig.coerce(json.loads(text)) == config


def test_frozen():
    config = EnvConfig()
    with pytest.raises(Exception):
        config.seed_retries = 5  # type: ignore[misc]


def test_unknown_key_and_bad_value_are_named():
    with pytest.raises(ConfigError, match="bogus"):
        EnvConfig.coerce({"bogus": 1})
    with pytest.raises(ConfigError, match="seed_retries"):
        EnvConfig.coerce({"seed_retries": -1})
    with pytest.raises(ConfigError, match="prompt_template"):
        EnvConfig.coerce({"prompt_template": "{{ instruction "})


def test_replace_validates():
    assert EnvConfig().replace(backend="docker").backend.value == "docker"
    with pytest.raises(ConfigError):
        EnvConfig().replace(backend="kubernetes")


def test_host_settings_file_feeds_image_defaults(tmp_path, monkeypatch):
    settings = tmp_path / "settings.toml"
    settings.write_text('pull_policy = "never"\n[image_aliases]\n"debian:bookworm-slim" = "local/base:1"\n')
    monkeypatch.setenv("HARBOR_GYM_SETTINGS", str(settings))
    monkeypatch.delenv("HARBOR_GYM_PULL_POLICY", raising=False)
    config = EnvConfig()
    assert config.effective_pull_policy() is PullPolicy.NEVER
    assert config.effective_image_aliases() == {"debian:bookworm-slim": "local/base:1"}
    # An explicit field wins over the file; the environment variable wins over the file's policy.
    assert EnvConfig(image_aliases={}).effective_image_aliases() == {}
    monkeypatch.setenv("HARBOR_GYM_PULL_POLICY", "always")
    assert host_settings().pull_policy is PullPolicy.ALWAYS


def test_broken_settings_file_names_the_file(tmp_path, monkeypatch):
    settings = tmp_path / "settings.toml"
    settings.write_text("pull_policy = \n")
    monkeypatch.setenv("HARBOR_GYM_SETTINGS", str(settings))
    with pytest.raises(ConfigError, match="settings.toml"):
        host_settings()


def test_missing_settings_file_gives_builtin_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_GYM_SETTINGS", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("HARBOR_GYM_PULL_POLICY", raising=False)
    assert host_settings().pull_policy is PullPolicy.MISSING
    assert host_settings().image_aliases == {}
