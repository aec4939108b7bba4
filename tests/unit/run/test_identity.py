"""Run identities (issue 15, honest resume): digests, differences, and check_resume's three cases."""

from __future__ import annotations

import json
import types

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError
from harbor_gym.run.identity import RUN_FILE, check_resume, config_digest, run_identity, write_identity


def _ident(tmp_path, **over):
    task = tmp_path / "t1"
    if not task.is_dir():
        task.mkdir()
        (task / "task.toml").write_text("x = 1\n")
    args = dict(agent="oracle", agent_args={}, seed=0, semantics="seed", config=EnvConfig(),
                tasks={"t1": types.SimpleNamespace(path=task)})
    args.update(over)
    return run_identity(**args)


def test_config_digest_ignores_labels_and_logs_but_not_outcome_fields():
    base = config_digest(EnvConfig())
    assert config_digest(EnvConfig(labels={"a": "b"}, logs_root="/tmp/x")) == base
    assert config_digest(EnvConfig(retry_agent_outages=True)) != base


def test_same_identity_resumes_silently_and_a_different_one_is_refused(tmp_path):
    out = tmp_path / "out"
    ident = _ident(tmp_path)
    assert check_resume(out, ident) == []  # a new folder
    write_identity(out, ident)
    assert json.loads((out / RUN_FILE).read_text()) == ident
    assert check_resume(out, _ident(tmp_path)) == []
    with pytest.raises(ConfigError, match=r"seed: 0 then, 4 now.*--force-resume"):
        check_resume(out, _ident(tmp_path, seed=4))
    with pytest.raises(ConfigError, match="agent_args"):
        check_resume(out, _ident(tmp_path, agent_args={"max_steps": 3}))
    (tmp_path / "t1" / "task.toml").write_text("x = 2\n")
    with pytest.raises(ConfigError, match="tasks changed since: t1"):
        check_resume(out, _ident(tmp_path))
    warnings = check_resume(out, _ident(tmp_path), force=True)
    assert len(warnings) == 1 and "tasks changed since: t1" in warnings[0]


def test_a_folder_without_run_json_resumes_with_a_warning(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rollouts.jsonl").write_text('{"task_id": "t1", "rollout": 0}\n')
    warnings = check_resume(out, _ident(tmp_path))
    assert len(warnings) == 1 and "no run.json" in warnings[0]
