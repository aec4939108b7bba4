"""The cause of a failure reaches the user (STOP-5, STOP-8, BUD-8): ``failure_message`` names the task, the step
and the cause, on the TurnRecord and on the EpisodeResult."""

import pytest

from harbor_gym.agents import AgentOutcome
from harbor_gym.episode import Episode
from harbor_gym.task import load_task

from .conftest import REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


# SPEC: STOP-5, TURN-8
def test_setup_failure_at_step_one_names_task_step_and_exit_code(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["01-base", "02-frosting"]),
                                 "steps/01-base/workdir/setup.sh": "exit 3\n", "tests/test.sh": REWARD_1},
                      name="cake")
    results, final = run_episode(task, ":")
    rec = results[0].record
    assert rec.failure_kind == "harbor:step_setup_failed"
    assert rec.failure_message == "cake: step 01-base: setup.sh exited 3"
    assert final.failure_message == rec.failure_message and not final.graded


# SPEC: STOP-8
def test_outage_names_the_dead_sandbox(tmp_path, docker_client):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": REWARD_1}, name="cake")
    ep = Episode(load_task(task), {"backend": "docker"})

    class Killer:
        def run(self, turn):
            docker_client.containers.get(ep.sandbox.name).kill()  # the engine loses the container mid-turn
            turn.exec("true")
            return AgentOutcome()

    with ep:
        ep.start()
        name = ep.sandbox.name
        ep.run_turn(":")
        r2 = ep.run_turn(Killer())
    msg = r2.record.failure_message
    assert r2.truncated and r2.record.failure_kind == "harbor_gym:sandbox_outage"
    assert msg.startswith(f"cake: step s2: sandbox {name} died: ") and "\n" not in msg
    assert r2.episode.failure_message == msg


# SPEC: BUD-8
def test_deadline_names_the_phase_it_cut(tmp_path):
    body = 'name = "s1"\n[steps.agent]\ntimeout_sec = 30\n[steps.verifier]\ntimeout_sec = 1\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": REWARD_1}, name="cake")
    results, final = run_episode(task, "sleep 25", {"enforce_task_timeouts": False,
                                                    "default_episode_timeout_seconds": 2})
    rec = results[0].record
    assert results[0].truncated and rec.failure_kind == "Episode timed out"
    assert rec.failure_message == "cake: step s1: episode deadline of 2 s passed during agent"
    assert final.failure_message == rec.failure_message


# SPEC: GYM-8 (no failure: no message)
def test_a_clean_turn_has_no_message(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1}, name="cake")
    results, final = run_episode(task, ":")
    assert results[0].record.failure_message is None and final.failure_message is None and final.reward == 1.0
