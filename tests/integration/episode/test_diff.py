"""SPEC §14 rows the engine covers, each run under both ``semantics`` settings on a real sandbox."""

import json
import time

import pytest

from harbor_gym.agents import AgentOutcome, Oracle
from harbor_gym.errors import SeedRefusedError

from .conftest import REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker
SEED, HARBOR = {"semantics": "seed"}, {"semantics": "harbor"}


def _three(top: str = "") -> str:
    return toml(["s1", "s2", "s3"], top=top)


# SPEC: DIFF-1
def test_diff_1_failed_preparation_step_2(tmp_path):
    task = write_task(tmp_path, {"task.toml": _three(), "steps/s2/workdir/setup.sh": "exit 1\n",
                                 "tests/test.sh": REWARD_1})
    _, seed = run_episode(task, ":", SEED)
    _, harbor = run_episode(task, ":", HARBOR)
    assert seed.reward == 0.5 and harbor.reward == 1.0
    assert seed.stopped_after_turn == harbor.stopped_after_turn == "s2"


# SPEC: DIFF-2
def test_diff_2_no_valid_reward_file(tmp_path):
    task = write_task(tmp_path, {"task.toml": _three(), "steps/s2/tests/test.sh": "#!/bin/bash\ntrue\n",
                                 "tests/test.sh": REWARD_1})
    s_res, seed = run_episode(task, ":", SEED)
    h_res, harbor = run_episode(task, ":", HARBOR)
    assert seed.reward == 0.5 and s_res[1].record.reward == 0.0
    assert harbor.reward == 1.0 and h_res[1].record.reward is None


# SPEC: DIFF-3
def test_diff_3_final_last_turn_without_result(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"], top='multi_step_reward_strategy = "final"'),
                                 "steps/s2/tests/test.sh": "#!/bin/bash\ntrue\n", "tests/test.sh": REWARD_1})
    _, seed = run_episode(task, ":", SEED)
    _, harbor = run_episode(task, ":", HARBOR)
    assert seed.reward == 0.0 and harbor.reward is None


# SPEC: DIFF-4
def test_diff_4_step_1_preparation_failure(tmp_path):
    task = write_task(tmp_path, {"task.toml": _three(), "steps/s1/workdir/setup.sh": "exit 1\n",
                                 "tests/test.sh": REWARD_1})
    _, seed = run_episode(task, ":", SEED)
    _, harbor = run_episode(task, ":", HARBOR)
    assert not seed.graded and not seed.retryable and seed.failure_kind == "harbor:step_setup_failed"
    assert not harbor.graded and harbor.retryable


# SPEC: DIFF-5
def test_diff_5_setup_bound(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "steps/s1/workdir/setup.sh": "sleep 2\n",
                                 "tests/test.sh": REWARD_1})
    s_res, _ = run_episode(task, ":", {**SEED, "step_setup_timeout_s": 0.5})
    h_res, _ = run_episode(task, ":", {**HARBOR, "step_setup_timeout_s": 0.5})
    assert s_res[0].record.failure_kind == "harbor:step_setup_failed"
    assert h_res[0].record.failure_kind is None and h_res[0].record.reward == 1.0


# SPEC: DIFF-6
def test_diff_6_logs_agent_before_a_step(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]),
                                 "steps/s2/tests/test.sh": grade("[ \"$(cat /app/saw)\" = yes ]"),
                                 "tests/test.sh": REWARD_1})
    script = "[ $HARBOR_STEP_INDEX = 0 ] && echo n > /logs/agent/notes.txt; " \
             "[ -e /logs/agent/notes.txt ] && echo yes > /app/saw || echo no > /app/saw"
    s_res, _ = run_episode(task, script, SEED)
    h_res, _ = run_episode(task, script, HARBOR)
    assert s_res[1].record.reward == 1.0 and h_res[1].record.reward == 0.0


# SPEC: DIFF-7
def test_diff_7_prompt_template(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": REWARD_1})
    cfg = {"prompt_template": "T: {{ instruction }}"}
    s_res, _ = run_episode(task, ":", {**SEED, **cfg})
    h_res, _ = run_episode(task, ":", {**HARBOR, **cfg})
    assert [r.record.instruction.startswith("T: ") for r in s_res] == [True, False]
    assert [r.record.instruction.startswith("T: ") for r in h_res] == [True, True]


# SPEC: DIFF-9, LOAD-8, LOAD-9
def test_diff_9_step_network_policies_keep_the_seed_side(tmp_path):
    # Harbor would switch phase policies where its provider can; no harbor_gym provider switches a running
    # sandbox's network, so both semantics refuse step policies (LOAD-8) and [verifier] ones of a shared step
    # (LOAD-9) at load, and honour a [verifier] policy where its sandbox is fresh (separate) without switching.
    from harbor_gym.config import EnvConfig
    from harbor_gym.errors import TaskLoadError
    from harbor_gym.task import load_task

    step_policy = write_task(tmp_path, {"task.toml": toml(['name = "s1"\n[steps.agent]\nnetwork_mode = "no-network"\n']),
                                        "tests/test.sh": REWARD_1}, "step-policy")
    shared = write_task(tmp_path, {"task.toml": toml(["s1"], tail='[verifier]\nnetwork_mode = "no-network"\n'),
                                   "tests/test.sh": REWARD_1}, "shared-policy")
    for semantics in ("seed", "harbor"):
        for task, rule in ((step_policy, "LOAD-8"), (shared, "LOAD-9")):
            with pytest.raises(TaskLoadError) as caught:
                load_task(task, EnvConfig(semantics=semantics))
            assert caught.value.rule == rule, (semantics, caught.value)
    # separate: the verifier sandbox's own table says public, [verifier] says no-network, and the phase wins
    no_eth0 = "#!/bin/bash\nif [ -e /sys/class/net/eth0 ]; then echo 0; else echo 1; fi > /logs/verifier/reward.txt\n"
    tail = '[verifier]\nnetwork_mode = "no-network"\n[verifier.environment]\nnetwork_mode = "public"\n'
    separate = write_task(tmp_path, {"task.toml": toml(["s1"], tail=tail), "tests/test.sh": no_eth0}, "separate")
    s_res, _ = run_episode(separate, ":", SEED)
    h_res, _ = run_episode(separate, ":", HARBOR)
    assert [r.record.verifier_mode for r in s_res + h_res] == ["separate", "separate"]
    assert s_res[0].record.reward == h_res[0].record.reward == 1.0


# SPEC: DIFF-10
def test_diff_10_first_step_trajectory(tmp_path):
    class Agent:
        def __init__(self):
            self.seen = []

        def run(self, turn):
            self.seen.append((turn.index, turn.prior_trajectory))
            return AgentOutcome()

    traj = '{"schema_version": "ATIF-v1.2", "steps": [{"step_id": 1, "source": "user", "message": "hi"}]}'
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "steps/s1/trajectory.json": traj,
                                 "tests/test.sh": REWARD_1})
    with pytest.raises(SeedRefusedError):
        run_episode(task, Agent(), SEED, agent=Agent())
    agent = Agent()
    res, _ = run_episode(task, agent, HARBOR, agent=agent)
    assert res[0].record.reward == 1.0
    # issue 16: under Harbor the first step's trajectory.json reaches the agent as prior context, on turn 0 only
    assert agent.seen == [(0, json.loads(traj)), (1, None)]


# SPEC: DIFF-11
def test_diff_11_continue_with_user_switch(tmp_path):
    class Cont:
        supports_continue = True

        def run(self, turn):
            return AgentOutcome()

    steps = ['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n',
             'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n']
    task = write_task(tmp_path, {"task.toml": toml(steps), "tests/test.sh": REWARD_1})
    agent = Cont()
    with pytest.raises(SeedRefusedError):
        run_episode(task, agent, {**SEED, "turn_sessions": "continue"}, agent=agent)
    res, final = run_episode(task, agent, {**HARBOR, "turn_sessions": "continue"}, agent=agent)
    assert final.reward == 1.0


# SPEC: DIFF-12
def test_diff_12_workdir_owner_on_user_switch(tmp_path):
    steps = ['name = "s1"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n']
    task = write_task(tmp_path, {"task.toml": toml(steps), "tests/test.sh": grade("[ \"$(stat -c %U /app)\" = nobody ]")})
    s_res, _ = run_episode(task, ":", SEED)
    h_res, _ = run_episode(task, ":", HARBOR)
    assert s_res[0].record.reward == 1.0 and h_res[0].record.reward == 0.0


# SPEC: DIFF-13
def test_diff_13_artifact_layout_keeps_seed_side(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    for cfg in (SEED, HARBOR):
        res, _ = run_episode(task, "echo a > /logs/artifacts/a", {**cfg, "logs_root": str(tmp_path / "l")})
        assert res[0].record.manifest[0].origin == "convention"


# SPEC: DIFF-14
def test_diff_14_test_sh_run(tmp_path):
    test = "#!/bin/sh\nif [ -n \"$BASH_VERSION\" ]; then echo 1; else echo 0.5; fi > /logs/verifier/reward.txt\n"
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": test})
    s_res, _ = run_episode(task, ":", SEED)
    h_res, _ = run_episode(task, ":", HARBOR)
    assert s_res[0].record.reward == 1.0 and h_res[0].record.reward == 0.5


# SPEC: DIFF-15
def test_diff_15_verifier_timeout_with_valid_file(tmp_path):
    body = 'name = "s1"\n[steps.verifier]\ntimeout_sec = 1\n'
    task = write_task(tmp_path, {"task.toml": toml([body]),
                                 "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nsleep 60\n"})
    s_res, seed = run_episode(task, ":", {**SEED, "verifier_grace_s": 2})
    h_res, harbor = run_episode(task, ":", HARBOR)
    assert s_res[0].record.reward == 1.0 and seed.reward == 1.0
    assert h_res[0].record.reward is None and harbor.reward is None


# SPEC: DIFF-16
def test_diff_16_agent_error(tmp_path):
    class Err:
        def run(self, turn):
            return AgentOutcome(status="error", policy="fail")

    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    _, seed = run_episode(task, Err(), SEED)
    h_res, harbor = run_episode(task, Err(), HARBOR)
    assert not seed.graded and seed.failure_kind == "harbor_gym:agent_failed"
    assert harbor.graded and harbor.reward == 1.0 and h_res[0].record.verifier_mode == "shared"


# SPEC: DIFF-17
def test_diff_17_episode_deadline(tmp_path):
    body = 'name = "{n}"\n[steps.agent]\ntimeout_sec = 1\n[steps.verifier]\ntimeout_sec = 1\n'
    task = write_task(tmp_path, {"task.toml": toml([body.format(n="s1"), body.format(n="s2")]),
                                 "tests/test.sh": REWARD_1})
    cfg = {"harness_setup_allowance_s": 0, "verifier_grace_s": 0.5, "deadline_clock": "wall"}
    wait = lambda ep, results: time.sleep(5.5)  # noqa: E731
    s_res, seed = run_episode(task, ":", {**SEED, **cfg}, between=wait)
    h_res, harbor = run_episode(task, ":", {**HARBOR, **cfg}, between=wait)
    assert s_res[-1].truncated and seed.failure_kind == "harbor:task_deadline"
    assert not h_res[-1].truncated and harbor.reward == 1.0


# SPEC: DIFF-18, TURN-7
def test_diff_18_healthcheck_attempt_overrun_keeps_the_seed_side(tmp_path):
    # Seed: an attempt that overruns timeout_sec is a counted failure and polling goes on; Harbor's exec error would
    # escape its step handler and end the trial, a defect harbor_gym does not copy: both semantics count it (here
    # attempt 1 overruns and is counted, 1 < retries = 2, and attempt 2 passes; TURN-7 fails the check at 2).
    hc = ('name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n[steps.healthcheck]\n'
          'command = "[ -f /tmp/hc ] || { touch /tmp/hc; sleep 30; }"\ntimeout_sec = 1\ninterval_sec = 0.1\n'
          'retries = 2\n')
    task = write_task(tmp_path, {"task.toml": toml([hc]), "tests/test.sh": REWARD_1})
    s_res, seed = run_episode(task, ":", SEED)
    h_res, harbor = run_episode(task, ":", HARBOR)
    assert seed.reward == harbor.reward == 1.0
    assert s_res[0].record.failure_kind is None and h_res[0].record.failure_kind is None


# SPEC: DIFF-19
def test_diff_19_solution_per_step(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "steps/s1/solution/solve.sh": "#!/bin/bash\ntrue\n",
        "steps/s1/solution/leftover.txt": "x\n",
        "steps/s2/solution/solve.sh": "#!/bin/bash\n[ -e /solution/leftover.txt ] && echo yes > /app/left || "
                                      "echo no > /app/left\n",
        "steps/s2/tests/test.sh": grade("[ \"$(cat /app/left)\" = no ]"),
        "tests/test.sh": REWARD_1,
    })
    s_res, _ = run_episode(task, Oracle(), SEED, agent=Oracle())
    h_res, _ = run_episode(task, Oracle(), HARBOR, agent=Oracle())
    assert s_res[1].record.reward == 1.0 and h_res[1].record.reward == 0.0


# SPEC: DIFF-20
def test_diff_20_booleans_in_reward_json(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "tests/test.sh": "#!/bin/bash\necho '{\"reward\": true}' > /logs/verifier/reward.json\n"})
    s_res, _ = run_episode(task, ":", SEED)
    h_res, _ = run_episode(task, ":", HARBOR)
    assert not s_res[0].record.reward_valid and s_res[0].record.reward == 0.0
    assert h_res[0].record.reward == 1.0
