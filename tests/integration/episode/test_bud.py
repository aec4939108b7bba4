"""BUD rules on real sandboxes: agent and setup budgets, the episode deadline (env vs wall clock)."""

import time

import pytest

from harbor_gym.errors import SeedRefusedError

from .conftest import REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


# SPEC: BUD-1
def test_bud_1_agent_budget_scaled_by_multiplier(tmp_path):
    body = 'name = "s1"\n[steps.agent]\ntimeout_sec = 4\n[steps.verifier]\ntimeout_sec = 10\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, "sleep 3", {"timeout_multiplier": 0.25})
    assert results[0].record.agent_status == "timeout" and results[0].record.timings["agent"] < 2.5


# SPEC: BUD-4
def test_bud_4_setup_bound(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "steps/s1/workdir/setup.sh": "sleep 20\n",
                                 "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, ":", {"step_setup_timeout_s": 1})
    assert results[0].record.failure_kind == "harbor:step_setup_failed"
    assert results[0].record.timings["prepare"] < 6


def _sleep_outside(seconds):
    return lambda ep, results: time.sleep(seconds)


def _deadline_task(tmp_path):
    body = 'name = "{n}"\n[steps.agent]\ntimeout_sec = 1\n[steps.verifier]\ntimeout_sec = 1\n'
    return write_task(tmp_path, {"task.toml": toml([body.format(n="s1"), body.format(n="s2")]),
                                 "tests/test.sh": REWARD_1})


TINY = {"harness_setup_allowance_s": 0, "verifier_grace_s": 0.5}  # deadline = 2 × (1 + 1 + 0.5) = 5 s


# SPEC: BUD-6, BUD-8
def test_bud_6_wall_clock_deadline_counts_policy_time(tmp_path):
    results, final = run_episode(_deadline_task(tmp_path), ":", {**TINY, "deadline_clock": "wall"},
                                 between=_sleep_outside(5.5))
    last = results[-1]
    assert last.truncated and not last.terminated
    assert last.record.failure_kind == "harbor:task_deadline"
    assert not final.graded and final.retryable and final.failure_kind == "harbor:task_deadline"


# SPEC: BUD-6
def test_bud_6_env_clock_ignores_time_between_calls(tmp_path):
    results, final = run_episode(_deadline_task(tmp_path), ":", TINY, between=_sleep_outside(5.5))
    assert not results[-1].truncated and final.reward == 1.0


# SPEC: BUD-8
def test_bud_8_deadline_stops_running_phase(tmp_path):
    body = 'name = "s1"\n[steps.agent]\ntimeout_sec = 30\n[steps.verifier]\ntimeout_sec = 1\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": REWARD_1})
    # not enforced: the deadline is default_episode_timeout_seconds (2 s); the 30 s agent is stopped at it
    t0 = time.monotonic()
    results, final = run_episode(task, "sleep 25", {"enforce_task_timeouts": False,
                                                    "default_episode_timeout_seconds": 2})
    assert time.monotonic() - t0 < 15
    assert results[0].truncated and final.failure_kind == "Episode timed out" and final.retryable


# SPEC: BUD-7
def test_bud_7_separate_step_refused_when_default_below_start_allowance(tmp_path):
    body = 'name = "s1"\n[steps.verifier]\ntimeout_sec = 1\nenvironment_mode = "separate"\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": REWARD_1})
    with pytest.raises(SeedRefusedError) as err:
        run_episode(task, ":", {"enforce_task_timeouts": False, "default_episode_timeout_seconds": 10})
    assert err.value.rule == "BUD-7"
