"""FMT-4..13 models: defaults declared once, frozen, and load -> dump -> load giving equal models."""

from __future__ import annotations

import pickle
import tomllib
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from harbor_gym.task import (
    CollectHook,
    EnvironmentConfig,
    HealthcheckConfig,
    StepVerifierConfig,
    TaskConfig,
    dump_task_toml,
    load_task,
    parse_task_toml,
)

from .conftest import FIXTURES, IMAGE, steps_toml

pytestmark = pytest.mark.filterwarnings("ignore::harbor_gym.task.LegacyKeyWarning")

FIXTURE_DIRS = sorted(p for p in FIXTURES.iterdir() if (p / "task.toml").is_file())

BUILT_TOMLS = [
    IMAGE,
    'version = "0.9"\n' + IMAGE + 'memory = "1.5G"\nallow_internet = true\n',
    IMAGE + 'network_mode = "allowlist"\nallowed_hosts = []\n[agent]\nallow_internet = false\n',
    'artifacts = ["/a", { source = "/b" }]\n' + IMAGE + steps_toml(["x"]) + "min_reward = 1\n",
]


def _roundtrip(config: TaskConfig, tmp_path: Path) -> TaskConfig:
    path = tmp_path / "task.toml"
    path.write_text(dump_task_toml(config))
    return parse_task_toml(path)


def test_fixture_folders_exist():
    assert {p.name for p in FIXTURE_DIRS} >= {"single-minimal", "multi-full", "legacy"}


@pytest.mark.parametrize("folder", FIXTURE_DIRS, ids=lambda p: p.name)
def test_fmt_roundtrip_every_fixture(folder, tmp_path):
    # SPEC: FMT-4..13 — load -> dump -> load gives an equal model (legacy keys come back migrated)
    task = load_task(folder)
    again = _roundtrip(task.config, tmp_path)
    assert again == task.config
    assert dump_task_toml(again) == dump_task_toml(task.config)


@pytest.mark.parametrize("toml", BUILT_TOMLS)
def test_fmt_roundtrip_built(toml, tmp_path):
    # SPEC: FMT-13 — the dump holds no legacy key and reloads equal
    (tmp_path / "task.toml").write_text(toml)
    config = parse_task_toml(tmp_path / "task.toml")
    dumped = tomllib.loads(dump_task_toml(config))
    for legacy in ("version", "multi_step_reward_mode"):
        assert legacy not in dumped
    assert "memory" not in dumped["environment"] and "allow_internet" not in dumped["environment"]
    assert _roundtrip(config, tmp_path) == config


def test_legacy_fixture_dump_is_migrated(tmp_path):
    # SPEC: FMT-13
    dumped = tomllib.loads(dump_task_toml(load_task(FIXTURES / "legacy").config))
    assert dumped["schema_version"] == "1.0"
    assert dumped["environment"]["memory_mb"] == 2048 and dumped["environment"]["storage_mb"] == 1
    assert dumped["environment"]["network_mode"] == "no-network"
    assert dumped["steps"][0]["verifier"]["environment"]["memory_mb"] == 512


def test_fmt_4_to_9_defaults():
    # SPEC: FMT-4..9 — defaults declared once
    config = TaskConfig()
    assert config.schema_version == "1.4" and config.source is None
    assert config.multi_step_reward_strategy is None and config.artifacts == () and config.steps is None
    assert config.task is None and config.metadata == {}
    assert (
        config.agent.timeout_sec,
        config.agent.user,
        config.agent.network_mode,
        config.agent.allowed_hosts,
    ) == (
        None,
        None,
        None,
        None,
    )
    assert config.solution.env == {}
    v = config.verifier
    assert (v.timeout_sec, v.env, v.user, v.environment_mode, v.environment, v.collect) == (
        600.0,
        {},
        None,
        None,
        None,
        (),
    )
    e = config.environment
    assert e.build_timeout_sec == 600.0 and e.os == "linux" and e.mcp_servers == () and e.env == {}
    assert e.network_mode == "public" and e.docker_image is None and e.memory_mb is None and e.workdir is None
    h = HealthcheckConfig(command="true")
    assert (h.interval_sec, h.timeout_sec, h.start_period_sec, h.start_interval_sec, h.retries) == (
        5.0,
        30.0,
        0.0,
        5.0,
        3,
    )
    c = CollectHook(command="x")
    assert (c.service, c.timeout_sec, c.user) == ("main", 60.0, None)
    assert StepVerifierConfig().timeout_sec == 600.0


def test_models_are_frozen_and_describe_every_field():
    # STYLE: frozen models, Field(description=) on every field
    with pytest.raises(ValidationError):
        EnvironmentConfig().cpus = 2  # type: ignore[misc]
    from harbor_gym.task import models, tables

    for name in models.__all__:
        obj = getattr(models, name)
        if isinstance(obj, type) and issubclass(obj, tables._Model):
            for field_name, info in obj.model_fields.items():
                assert info.description, f"{name}.{field_name} lacks a description"


@pytest.mark.parametrize("folder", FIXTURE_DIRS, ids=lambda p: p.name)
def test_task_pickles(folder):
    # STYLE 14: results pickle (vector envs)
    task = load_task(folder)
    assert pickle.loads(pickle.dumps(task)) == task


def test_loading_is_fast():
    # brief: loading a task takes about a millisecond, never seconds
    import time

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        for _ in range(20):
            load_task(FIXTURES / "multi-full")
        assert (time.perf_counter() - start) / 20 < 0.05
