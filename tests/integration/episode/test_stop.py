"""STOP rules on real sandboxes: min_reward, agent outcomes, outages, stopped_after_turn, sandboxes stopped."""

import pytest

from harbor_gym.agents import AgentOutcome
from harbor_gym.episode import Episode
from harbor_gym.task import load_task

from .conftest import BACKENDS, REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


def _steps(min_reward: str, n: int = 3) -> list[str]:
    out = []
    for i in range(1, n + 1):
        body = f'name = "s{i}"\n'
        last = min_reward.startswith("last:")
        if (i == 1 and not last) or (i == n and last):
            body += f"min_reward = {min_reward.removeprefix('last:')}\n"
        out.append(body + "[steps.verifier]\ntimeout_sec = 10\n")
    return out


def _json(payload: str) -> str:
    return f"#!/bin/bash\necho '{payload}' > /logs/verifier/reward.json\n"


# SPEC: STOP-2, STOP-1
@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_2_number_min_reward_missed_stops(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(_steps("0.9")), "tests/test.sh": _json('{"reward": 0.5}')})
    results, final = run_episode(task, ":", backend=backend)
    assert len(results) == 1 and results[0].record.min_reward_missed and results[0].terminated
    assert final.stopped_after_turn == "s1" and final.reward == 0.5 and final.graded


# SPEC: STOP-2
def test_stop_2_component_keys_never_pass_number(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(_steps("0.1")), "tests/test.sh": _json('{"a": 1, "b": 1}')})
    results, _ = run_episode(task, ":")
    assert results[0].record.min_reward_missed and len(results) == 1


# SPEC: STOP-3
def test_stop_3_table_min_reward(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(_steps("{ a = 1.0, b = 0.5 }")),
                                 "tests/test.sh": _json('{"a": 1, "b": 0.5}')})
    results, _ = run_episode(task, ":")
    assert not results[0].record.min_reward_missed and len(results) == 3
    task2 = write_task(tmp_path, {"task.toml": toml(_steps("{ a = 1.0, c = 0.0 }")),
                                  "tests/test.sh": _json('{"a": 1, "b": 0.5}')}, name="ep-task2")
    results2, _ = run_episode(task2, ":")
    assert results2[0].record.min_reward_missed and len(results2) == 1


# SPEC: STOP-4
def test_stop_4_min_reward_on_last_step_only_marks(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(_steps("last:0.9", n=2)),
                                 "tests/test.sh": "#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n"})
    results, final = run_episode(task, ":")
    assert results[1].record.min_reward_missed and final.stopped_after_turn is None
    assert final.reward == 0.5 and final.failure_kind is None


class _Outcome:
    def __init__(self, **kw):
        self.kw = kw

    def run(self, turn):
        turn.exec("touch /app/ran")
        return AgentOutcome(**self.kw)


# SPEC: STOP-6, STOP-7
@pytest.mark.parametrize("policy,kind,retryable", [("retry", "harbor_gym:agent_retry", True),
                                                   ("fail", "harbor_gym:agent_failed", False)])
def test_stop_6_agent_error_retry_or_fail_ends_ungraded(tmp_path, policy, kind, retryable):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": REWARD_1})
    results, final = run_episode(task, _Outcome(status="error", policy=policy))
    rec = results[0].record
    assert rec.agent_status == "error" and rec.verifier_mode is None and rec.manifest == ()  # before collection
    assert results[0].terminated and not final.graded and final.reward is None
    assert final.failure_kind == kind and final.retryable is retryable


# SPEC: STOP-6, STOP-7
def test_stop_6_agent_error_grade_and_timeout_are_graded(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    results, final = run_episode(task, _Outcome(status="error"), {"agent_outcome_policy": "grade"})
    assert results[0].record.reward == 1.0 and final.graded
    results, final = run_episode(task, _Outcome(status="timeout"))
    assert results[0].record.agent_status == "timeout" and final.reward == 1.0
    _, final = run_episode(task, _Outcome(status="error"), {"agent_outcome_policy": "fail"})
    assert final.failure_kind == "harbor_gym:agent_failed"


# SPEC: STOP-8, STOP-10
@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_8_outage_truncates_retryable(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": REWARD_1})
    cfg = {"backend": backend}
    ep = Episode(load_task(task), cfg)

    class Killer:
        def run(self, turn):
            ep.sandbox.stop()  # the sandbox dies under the agent
            turn.exec("true")
            return AgentOutcome()

    with ep:
        ep.start()
        r1 = ep.run_turn(":")
        r2 = ep.run_turn(Killer())
        assert r2.truncated and not r2.terminated
        assert r2.record.failure_kind == "harbor_gym:sandbox_outage"
        res = r2.episode
        assert not res.graded and res.retryable and res.reward is None and res.failure_kind == "harbor_gym:sandbox_outage"
        assert ep.is_over and ep.sandbox is None  # STOP-10
        with pytest.raises(RuntimeError):
            ep.run_turn(":")
    assert r1.record.reward == 1.0


# SPEC: STOP-8, GYM-12, GYM-13
def test_stop_8_an_engine_failure_inside_run_is_an_outage_not_the_agents_error(tmp_path):
    import requests

    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    ep = Episode(load_task(task), {"backend": "docker"})

    class Hiccup:
        """Its one command meets an engine that does not answer in time (the sandbox itself is fine)."""

        def run(self, turn):
            api = ep.sandbox.client.api
            create = api.exec_create

            def late(*args, **kwargs):
                api.exec_create = create  # once
                raise requests.exceptions.ReadTimeout("read timed out")

            api.exec_create = late
            turn.exec("true")
            return AgentOutcome()

    class BadFolder:
        def run(self, turn):
            turn.exec("true", cwd="/no/such/folder")  # the agent's own mistake: its error, graded (GYM-5)
            return AgentOutcome()

    with ep:
        ep.start()
        r = ep.run_turn(Hiccup())
        assert r.truncated and not r.terminated
        assert r.record.failure_kind == "harbor_gym:sandbox_outage", r.record
        assert not r.record.agent_caused and not r.record.trainable  # the engine's doing: nothing to train on
        assert not r.episode.graded and r.episode.retryable
    ep = Episode(load_task(task), {"backend": "docker"})
    with ep:
        ep.start()
        r = ep.run_turn(BadFolder())
        assert r.terminated and r.record.agent_status == "error" and r.episode.graded, r.record


# SPEC: STOP-9
def test_stop_9_stopped_after_turn_and_response(tmp_path):
    class Talker:
        def run(self, turn):
            return AgentOutcome(response=f"r{turn.index}")

    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2", "s3"]),
                                 "steps/s2/tests/test.sh": "#!/bin/bash\ntrue\n", "tests/test.sh": REWARD_1})
    _, final = run_episode(task, Talker())
    assert final.stopped_after_turn == "s2" and final.response == "r1"
    _, full = run_episode(task, [Talker(), ":", Talker()][:1] * 1 + [Talker()] * 2)
    assert [t.step_name for t in full.turns] == ["s1", "s2"]
