"""Budgets and the episode deadline (SPEC BUD-1..7, DIFF-5, DIFF-17): pure, no Docker."""

import pytest

from harbor_gym.episode._budgets import (
    UNBOUNDED_TERM_S,
    StepBudgets,
    agent_budget,
    episode_deadline,
    healthcheck_worst_case,
    setup_bound,
    verifier_budget,
)


# SPEC: BUD-1
def test_bud_1_agent_budget_precedence_multiplier_and_cap():
    assert agent_budget(10, 60, 2.0) == 20.0
    assert agent_budget(None, 60, 1.5) == 90.0
    assert agent_budget(None, None, 2.0) is None
    assert agent_budget(100, None, 1.0, cap=30) == 30
    assert agent_budget(None, None, 1.0, cap=30) == 30


# SPEC: BUD-2
def test_bud_2_verifier_budget_scales():
    assert verifier_budget(600.0, 1.0) == 600.0
    assert verifier_budget(30, 2.0) == 60.0


# SPEC: BUD-4
def test_bud_4_setup_bound():
    assert setup_bound(5.0, 100.0) == 5.0
    assert setup_bound(None, 100.0) == 100.0
    assert setup_bound(None, None) is None


# SPEC: DIFF-5
def test_diff_5_harbor_setup_unbounded():
    assert setup_bound(5.0, 100.0, harbor=True) is None


# SPEC: BUD-5
def test_bud_5_healthcheck_worst_case():
    # 0 + 5 + (3+1)*30 + 3*5 = 140
    assert healthcheck_worst_case(0.0, 5.0, 30.0, 5.0, 3) == 140.0
    # retries 0 counts as 1: 1 + 2 + 2*3 + 1*4 = 13
    assert healthcheck_worst_case(1.0, 2.0, 3.0, 4.0, 0) == 13.0


# SPEC: BUD-6
def test_bud_6_deadline_sum():
    steps = [
        StepBudgets(agent=10, verifier=20, setup=5, has_setup=True, healthcheck=7, collect_timeouts=(60,)),
        StepBudgets(agent=None, verifier=30, separate=True, sandbox_start_allowance=100),
    ]
    d = episode_deadline(steps, enforce=True, harness_setup_allowance_s=1, verifier_grace_s=2,
                         default_episode_timeout_s=1e9)
    first = 1 + 5 + 7 + 10 + 20 + 2 + 60
    second = 1 + UNBOUNDED_TERM_S + 30 + 2 + 100
    assert d == pytest.approx(first + second)


# SPEC: BUD-6
def test_bud_6_deadline_above_default_still_applies(caplog):
    d = episode_deadline([StepBudgets(agent=100, verifier=100)], enforce=True, harness_setup_allowance_s=0,
                         verifier_grace_s=0, default_episode_timeout_s=50)
    assert d == 200
    assert "BUD-6" in caplog.text


# SPEC: BUD-7
def test_bud_7_not_enforced_uses_default():
    assert episode_deadline([StepBudgets(agent=1, verifier=1)], enforce=False, harness_setup_allowance_s=0,
                            verifier_grace_s=0, default_episode_timeout_s=123) == 123


# SPEC: DIFF-17
def test_diff_17_harbor_has_no_deadline():
    assert episode_deadline([StepBudgets(agent=1, verifier=1)], enforce=True, harness_setup_allowance_s=0,
                            verifier_grace_s=0, default_episode_timeout_s=123, harbor=True) is None


def _task_with_hooks(tmp_path):
    from harbor_gym.task import load_task

    task = tmp_path / "budgets"
    (task / "steps" / "one" / "workdir").mkdir(parents=True)
    (task / "steps" / "one" / "instruction.md").write_text("do it\n")
    (task / "steps" / "one" / "workdir" / "setup.sh").write_text("#!/bin/bash\n:\n")
    (task / "steps" / "two").mkdir(parents=True)
    (task / "steps" / "two" / "instruction.md").write_text("do it\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").write_text("never sent\n")
    (task / "task.toml").write_text(
        """
[environment]
docker_image = "debian:bookworm-slim"
build_timeout_sec = 111.0

[[verifier.collect]]
command = "true"
timeout_sec = 7.0

[[steps]]
name = "one"
[steps.agent]
timeout_sec = 10.0
[steps.verifier]
timeout_sec = 20.0
[steps.healthcheck]
command = "true"
interval_sec = 1.0
timeout_sec = 2.0
start_period_sec = 3.0
start_interval_sec = 4.0
retries = 2

[[steps]]
name = "two"
[steps.verifier]
timeout_sec = 5.0
environment_mode = "separate"
[steps.verifier.environment]
docker_image = "debian:bookworm-slim"
build_timeout_sec = 222.0
"""
    )
    return load_task(task)


# SPEC: BUD-3
def test_bud_3_multiplier_never_scales_collect_hooks_or_healthchecks(tmp_path):
    from harbor_gym.episode._budgets import task_step_budgets

    task = _task_with_hooks(tmp_path)
    one, two = task_step_budgets(task, ["shared", "separate"], multiplier=3.0, step_setup_timeout_s=None,
                                 agent_cap=None)
    assert one.agent == 30.0 and one.verifier == 60.0  # BUD-1/2: scaled by m
    assert one.setup == 30.0  # BUD-4: the turn's (scaled) agent budget
    assert one.collect_timeouts == (7.0,)  # BUD-3: hook timeouts as written
    r = 2
    assert one.healthcheck == 3.0 + 4.0 + (r + 1) * 2.0 + r * 1.0  # BUD-3/5: h as written, never × m
    assert two.collect_timeouts == (7.0,) and two.healthcheck is None


# SPEC: BUD-9
def test_bud_9_sandbox_start_allowance_is_the_verifier_environments_build_timeout(tmp_path):
    from harbor_gym.episode._budgets import task_step_budgets

    task = _task_with_hooks(tmp_path)
    one, two = task_step_budgets(task, ["shared", "separate"], multiplier=1.0, step_setup_timeout_s=None,
                                 agent_cap=None)
    assert two.separate and two.sandbox_start_allowance == 222.0  # the step's verifier environment's
    assert not one.separate
    deadline = episode_deadline([one, two], enforce=True, harness_setup_allowance_s=0.0, verifier_grace_s=0.0,
                                default_episode_timeout_s=1e9)
    assert deadline == (10.0 + 10.0 + one.healthcheck + 20.0 + 7.0) + (UNBOUNDED_TERM_S + 5.0 + 7.0 + 222.0)
