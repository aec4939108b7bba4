"""GYM-2 seeding and the seed refusals (LOAD-20..24) on real sandboxes: nothing starts before a refusal."""

import pytest

from harbor_gym.agents import AgentOutcome, Oracle
from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode
from harbor_gym.errors import SandboxError, SeedError, SeedRefusedError
from harbor_gym.sandbox import open as open_sandbox
from harbor_gym.sandbox.base import SandboxSettings
from harbor_gym.task import load_task

from .conftest import REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


class CountingFactory:
    def __init__(self, fail_first=0):
        self.calls, self.fail_first = 0, fail_first

    def __call__(self, spec):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise SandboxError("engine hiccup", retryable=True)
        return open_sandbox(spec, backend="docker", settings=SandboxSettings.from_config(EnvConfig()))


def _episode(task_dir, factory, config=None, agent=None):
    cfg = EnvConfig.coerce(config or {})
    return Episode(load_task(task_dir, cfg), cfg, sandbox_factory=factory, agent=agent)


# SPEC: GYM-2
def test_gym_2_seed_copies_environment_files_and_retries_outages(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "environment/menu.txt": "cake\n",
                                 "tests/test.sh": "#!/bin/bash\n[ -f /app/menu.txt ] && echo 1 > /logs/verifier/reward.txt\n"})
    factory = CountingFactory(fail_first=2)
    with _episode(task, factory, {"seed_retries": 2}) as ep:
        ep.start()
        assert ep.run_turn(":").record.reward == 1.0
    assert factory.calls == 3
    factory = CountingFactory(fail_first=5)
    with pytest.raises(SeedError) as err, _episode(task, factory, {"seed_retries": 1}) as ep:
        ep.start()
    assert err.value.retryable and factory.calls == 2


# SPEC: GYM-2, TURN-7
def test_gym_2_failing_seed_healthcheck_is_retryable_seed_error(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1"], env='[environment.healthcheck]\ncommand = "false"\ninterval_sec = 0.1\n'
                                      'start_interval_sec = 0.1\nretries = 1\ntimeout_sec = 1\n'),
        "tests/test.sh": REWARD_1})
    with pytest.raises(SeedError) as err, _episode(task, CountingFactory()) as ep:
        ep.start()
    assert err.value.retryable


def _refused(task, config=None, agent=None):
    factory = CountingFactory()
    with pytest.raises(SeedRefusedError) as err, _episode(task, factory, config, agent) as ep:
        ep.start()
    assert factory.calls == 0  # before any sandbox starts
    return err.value


# SPEC: LOAD-20
def test_load_20_first_step_trajectory_only_with_oracle(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "steps/s1/trajectory.json": "{}",
                                 "solution/solve.sh": "#!/bin/bash\ntrue\n", "tests/test.sh": REWARD_1})
    assert _refused(task, agent=None).rule == "GYM-4"
    assert _refused(task, agent=type("A", (), {"run": lambda s, t: AgentOutcome()})()).rule == "LOAD-20"
    results, _ = run_episode(task, Oracle(), agent=Oracle())
    assert results[0].record.reward == 1.0


# SPEC: LOAD-22
def test_load_22_continue_needs_supports_continue_and_one_user(tmp_path):
    class Cont:
        supports_continue = True

        def run(self, turn):
            return AgentOutcome()

    two_users = ['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n',
                 'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n']
    task = write_task(tmp_path, {"task.toml": toml(two_users), "tests/test.sh": REWARD_1})
    cfg = {"turn_sessions": "continue"}
    assert _refused(task, cfg, agent=Oracle()).rule == "LOAD-22"
    assert _refused(task, cfg, agent=Cont()).rule == "LOAD-22"


# SPEC: LOAD-23
def test_load_23_unset_template_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("HG_SURELY_UNSET", raising=False)
    task = write_task(tmp_path, {"task.toml": toml(["s1"], env='env = { K = "${HG_SURELY_UNSET}" }'),
                                 "tests/test.sh": REWARD_1})
    assert _refused(task).rule == "LOAD-23"


# SPEC: LOAD-24
def test_load_24_allowlist_and_gpus_refused(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]).replace(
        'network_mode = "no-network"', 'network_mode = "allowlist"\nallowed_hosts = ["example.com"]'),
        "tests/test.sh": REWARD_1})
    assert _refused(task).rule == "LOAD-24"
    task2 = write_task(tmp_path, {"task.toml": toml(["s1"], env="gpus = 1"), "tests/test.sh": REWARD_1},
                       name="ep-task2")
    assert _refused(task2).rule == "LOAD-24"


_VERIFIER_IMAGE = 'docker_image = "debian:bookworm-slim"\n'


# SPEC: LOAD-24 (issue 16: every separate verifier environment is checked at seed, before any sandbox starts)
@pytest.mark.parametrize("tail,steps,field", [
    pytest.param("[verifier.environment]\n" + _VERIFIER_IMAGE + 'network_mode = "allowlist"\n'
                 'allowed_hosts = ["example.com"]\n', ["s1"], "verifier.environment.network_mode",
                 id="verifier-env-allowlist"),
    pytest.param("", ['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n[steps.verifier.environment]\n'
                      + _VERIFIER_IMAGE + 'gpu_types = ["a100"]\n'], "steps.s1.verifier.environment.gpu_types",
                 id="step-verifier-env-gpu-types"),
    pytest.param("[verifier.environment]\n" + _VERIFIER_IMAGE + 'tpu = "v5e-1"\n', ["s1"],
                 "verifier.environment.tpu", id="verifier-env-tpu"),
    # a phase policy the agent sandbox would have to switch to (FMT-5): refused, not ignored
    pytest.param('network_mode = "public"\n', ["s1"], "agent.network_mode", id="agent-phase-policy"),
])
def test_load_24_verifier_environments_and_phase_policies_refused_at_seed(tmp_path, tail, steps, field):
    task = write_task(tmp_path, {"task.toml": toml(steps, tail=tail), "tests/test.sh": REWARD_1})
    # the local provider too, which has no engine-side pre-checks (`_engine_refusals`): refused by seed_refusals
    for semantics, backend in (("seed", "docker"), ("harbor", "docker"), ("seed", "local")):
        err = _refused(task, {"semantics": semantics, "backend": backend}, agent=Oracle())
        assert err.rule == "LOAD-24" and err.field == field, (semantics, backend, err)
