"""The action side without Docker: outcomes, the Turn's bounded exec, scripts, the oracle (SPEC GYM-4/5, ORACLE-2)."""

import time

import pytest

from harbor_gym.agents import AgentOutcome, AgentStatus, Oracle, ScriptAgent, Turn, as_agent, supports_continue
from harbor_gym.agents import agent_timeout_cap
from harbor_gym.config import AgentOutcomePolicy
from harbor_gym.sandbox.base import ExecResult


class FakeExec:
    def __init__(self, result=None):
        self.calls = []
        self.result = result or ExecResult(exit_code=3, stdout="out", stderr="err")

    def __call__(self, command, **kw):
        self.calls.append((command, kw))
        return self.result


def make_turn(fake, budget=None, **kw):
    deadline = None if budget is None else time.monotonic() + budget
    return Turn(step_name="s1", index=0, num_steps=2, instruction="hi", user="agent", budget_sec=budget,
                workdir="/app", _exec_fn=fake, _deadline=deadline, **kw)


# SPEC: GYM-5
def test_gym_5_outcome_coerces_and_policy():
    o = AgentOutcome(status="error")
    assert o.status is AgentStatus.ERROR
    assert o.effective_policy(AgentOutcomePolicy.RETRY) is AgentOutcomePolicy.RETRY
    assert AgentOutcome(status="error", policy="fail").effective_policy(AgentOutcomePolicy.GRADE).value == "fail"
    assert AgentOutcome().effective_policy(AgentOutcomePolicy.FAIL) is None
    with pytest.raises(ValueError):
        AgentOutcome(status="weird")


# SPEC: GYM-4
def test_gym_4_script_env_user_and_exit_code_recorded():
    fake = FakeExec()
    outcome = ScriptAgent("exit 3").run(make_turn(fake, budget=10))
    (cmd, kw), = fake.calls
    assert cmd == ["bash", "-c", "exit 3"]
    assert kw["user"] == "agent" and kw["cwd"] == "/app" and 0 < kw["timeout"] <= 10
    assert kw["env"] == {"HARBOR_STEP_NAME": "s1", "HARBOR_STEP_INDEX": "0", "HARBOR_NUM_STEPS": "2"}
    assert outcome.status is AgentStatus.COMPLETED and outcome.exit_code == 3


# SPEC: GYM-4
def test_gym_4_script_timeout_is_status_timeout():
    fake = FakeExec(ExecResult(exit_code=-1, timed_out=True))
    assert ScriptAgent(":").run(make_turn(fake, budget=1)).status is AgentStatus.TIMEOUT


# SPEC: GYM-5
def test_gym_5_expired_turn_runs_nothing():
    fake = FakeExec()
    turn = make_turn(fake, budget=5)
    turn.expire()
    assert turn.exec("true").timed_out and not fake.calls


# SPEC: ORACLE-2
def test_oracle_2_runs_solve_sh_with_solution_env():
    fake = FakeExec(ExecResult(exit_code=0, stdout="done"))
    outcome = Oracle().run(make_turn(fake, solution_env={"K": "v"}))
    (cmd, kw), = fake.calls
    assert "/solution/solve.sh > /logs/agent/oracle.txt" in cmd[2] and "chmod +x /solution/solve.sh" in cmd[2]
    assert kw["env"] == {"K": "v", "DEBIAN_FRONTEND": "noninteractive"}
    assert outcome.exit_code == 0 and outcome.output_tail == "done"


def test_as_agent_and_capabilities():
    assert isinstance(as_agent("echo"), ScriptAgent)
    assert isinstance(as_agent(Oracle()), Oracle)
    with pytest.raises(TypeError):
        as_agent(3)

    class A:
        supports_continue = True
        timeout_sec = 12

        def run(self, turn):
            return AgentOutcome()

    assert supports_continue(A()) and not supports_continue(Oracle())
    assert agent_timeout_cap(A()) == 12.0 and agent_timeout_cap(Oracle()) is None
