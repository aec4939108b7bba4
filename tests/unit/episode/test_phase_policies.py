"""Issue 16: the workdir under each semantics and phase network policies as the specs say them (pure, no sandbox)."""

from __future__ import annotations

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.episode._spec import agent_spec, phase_policy_refusals, verifier_spec, workdir_created
from harbor_gym.errors import SeedRefusedError
from harbor_gym.task import load_task
from task_folders import REWARD_1, toml, write_task


# SPEC: GYM-2 (issue 16: Seed creates a missing workdir, Harbor semantics do not)
def test_workdir_created_follows_the_semantics(tmp_path):
    task = load_task(write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1}, "t"))
    assert workdir_created(EnvConfig()) and not workdir_created(EnvConfig(semantics="harbor"))
    assert agent_spec(task).create_workdir and not agent_spec(task, create_workdir=False).create_workdir


def _task(tmp_path, tail: str = "", steps=("s1",), name: str = "t"):
    return load_task(write_task(tmp_path, {"task.toml": toml(list(steps), tail=tail), "tests/test.sh": REWARD_1},
                                name))


# SPEC: LOAD-24 (phase policies a sandbox would have to switch to), DIFF-9
@pytest.mark.parametrize("tail,modes,field", [
    ('network_mode = "public"\n', ["shared"], "agent.network_mode"),
    ('network_mode = "allowlist"\nallowed_hosts = ["a.com"]\n', ["shared"], "agent.network_mode"),
    ('[verifier]\nnetwork_mode = "public"\n', ["shared"], "verifier.network_mode"),
])
def test_phase_policies_refused(tmp_path, tail, modes, field):
    with pytest.raises(SeedRefusedError) as caught:
        phase_policy_refusals(_task(tmp_path, tail), modes)
    assert caught.value.rule == "LOAD-24" and caught.value.field == field


def test_phase_policies_that_need_no_switch_pass_and_a_separate_verifier_gets_its_own(tmp_path):
    same = _task(tmp_path, 'network_mode = "no-network"\n', name="same")
    phase_policy_refusals(same, ["shared"])  # equal to [environment]'s: nothing to switch
    public_env = ('[verifier]\nnetwork_mode = "no-network"\n[verifier.environment]\nnetwork_mode = "public"\n')
    task = _task(tmp_path, public_env, name="sep")
    phase_policy_refusals(task, ["separate"])
    spec, _ = verifier_spec(task, task.steps[0], agent=agent_spec(task))
    assert spec.network is False  # [verifier]'s phase policy wins over the table's own public
    plain = _task(tmp_path, '[verifier.environment]\nnetwork_mode = "public"\n', name="plain")
    assert verifier_spec(plain, plain.steps[0], agent=agent_spec(plain))[0].network is True
    allow = _task(tmp_path, '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.com"]\n'
                            '[verifier.environment]\ncpus = 1\n', name="allow")
    with pytest.raises(SeedRefusedError) as caught:  # a separate verifier's allowlist: no egress control
        verifier_spec(allow, allow.steps[0], agent=agent_spec(allow))
    assert caught.value.rule == "LOAD-24" and caught.value.field == "verifier.network_mode"
