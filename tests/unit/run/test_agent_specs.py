"""``--agent`` specs: oracle, script:FILE, script:DIR, module:Class; anything else a one-line ConfigError."""

from __future__ import annotations

import textwrap

import pytest

from harbor_gym.agents import Oracle, ScriptAgent
from harbor_gym.errors import ConfigError
from harbor_gym.run import resolve_agent


def test_oracle():
    spec = resolve_agent("oracle")
    agent = spec.new()
    assert spec.label == "oracle" and isinstance(agent.announced, Oracle) and agent.action_for("x") == Oracle()


def test_script_file_is_every_turns_action(tmp_path):
    (tmp_path / "a.sh").write_text("echo hi\n")
    agent = resolve_agent(f"script:{tmp_path / 'a.sh'}").new()
    assert agent.action_for("s1") == agent.action_for("s2") == "echo hi\n"
    assert isinstance(agent.announced, ScriptAgent)


def test_script_folder_per_step_then_default_then_noop(tmp_path):
    (tmp_path / "s1.sh").write_text("one")
    agent = resolve_agent(f"script:{tmp_path}").new()
    assert agent.action_for("s1") == "one" and agent.action_for("s2") == ":"
    (tmp_path / "default.sh").write_text("dflt")
    agent = resolve_agent(f"script:{tmp_path}").new()
    assert agent.action_for("s2") == "dflt"


def test_module_class_from_a_file_is_made_per_episode(tmp_path):
    file = tmp_path / "agent_mod.py"
    file.write_text(textwrap.dedent("""
        class Mine:
            def run(self, turn):
                return None
    """))
    spec = resolve_agent(f"{file}:Mine")
    a, b = spec.new(), spec.new()
    assert type(a.announced).__name__ == "Mine" and a.announced is not b.announced
    assert a.action_for("s") is a.announced


def test_module_class_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "cwd_agents_mod.py").write_text("class A:\n    def run(self, turn):\n        return None\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_agent("cwd_agents_mod:A").label == "cwd_agents_mod:A"


@pytest.mark.parametrize("spec", ["frob", "script:", "script:/no/such/file", "no_such_module_xyz:A",
                                  "harbor_gym.agents:NoSuch", "harbor_gym.agents:Turn"])
def test_unknown_or_broken_specs_raise_one_line_error_naming_them(spec):
    with pytest.raises(ConfigError) as info:
        resolve_agent(spec)
    message = str(info.value)
    assert spec in message and "--agent" in message and "\n" not in message


def test_script_folder_without_scripts_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no .sh file"):
        resolve_agent(f"script:{tmp_path}")
