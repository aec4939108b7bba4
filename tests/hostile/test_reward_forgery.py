"""P1 "a reward is the verifier's": an agent that tries to write its own reward gets exactly what the task's
test.sh wrote. Real episodes on Docker (and the local backend where it applies).

test.sh variants: ``always`` writes 1 or 0 (the agent's work is never done here, so 0); ``only_on_pass`` writes 1
on success and nothing otherwise (a common pattern, and the one planted files would exploit): no valid reward file,
a measured 0 that stops the episode (RWD-6, STOP-1).
"""

from __future__ import annotations

import pytest

from .helpers import DOCKER, LOCAL, config, grade, run_episode, toml, write_task

ALWAYS = grade("[ -f /app/done ]", then_sleep=1)
ONLY_ON_PASS = "#!/bin/bash\nif [ -f /app/done ]; then echo 1 > /logs/verifier/reward.txt; fi\nsleep 1\n"
FORGED_TEST = "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n'"
WRITER = ("nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; "
          "echo \"{\\\"reward\\\": 1}\" > /logs/verifier/reward.json 2>/dev/null; sleep 0.05; done' "
          ">/dev/null 2>&1 &")

ATTACKS = {
    "plants-reward-files": "echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json",
    "plants-test-sh": f"mkdir -p /tests; {FORGED_TEST} > /tests/test.sh; chmod +x /tests/test.sh",
    "edits-image-tests": f"{FORGED_TEST} > /tests/test.sh; chmod 0555 /tests/test.sh; chmod 0555 /tests",
    "verifier-dir-unwritable": "chmod 000 /logs/verifier; chmod 000 /logs",
    "verifier-dir-is-a-file": "rm -rf /logs/verifier; echo 1 > /logs/verifier",
    "verifier-dir-symlink": "mkdir -p /tmp/f; echo 1 > /tmp/f/reward.txt; rm -rf /logs/verifier; "
                            "ln -s /tmp/f /logs/verifier",
    "tests-dir-symlink": f"mkdir -p /tmp/e; {FORGED_TEST} > /tmp/e/test.sh; chmod +x /tmp/e/test.sh; rm -rf /tests; "
                         "ln -s /tmp/e /tests",
    "logs-dir-symlink": "mkdir -p /tmp/l/verifier /tmp/l/agent; echo 1 > /tmp/l/verifier/reward.txt; rm -rf /logs; "
                        "ln -s /tmp/l /logs",
}


def _backends():
    return [pytest.param(DOCKER, marks=pytest.mark.docker, id="docker"),
            pytest.param(LOCAL, marks=pytest.mark.bwrap, id="local")]


# SPEC: VER-6, VER-8, RWD-1, RWD-6 (P1: files, folders and scripts an agent plants never become the reward)
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("verifier", [ALWAYS, ONLY_ON_PASS], ids=["always", "only_on_pass"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_p1_planted_rewards_tests_and_folders_never_count(tmp_path, backend, verifier, attack):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": verifier}, name="forge")
    results, final = run_episode(task, [ATTACKS[attack], ":"], config(backend))
    first = results[0].record
    assert first.reward == 0.0, first
    if verifier is ALWAYS:  # the verifier's own 0 counts; the episode goes on
        assert first.reward_valid and first.verifier_rewards == {"reward": 0.0} and len(results) == 2
        assert first.failure_kind is None, first
    else:  # no file of the verifier's own: measured 0, stop (planted files were removed before test.sh ran)
        assert not first.reward_valid and len(results) == 1 and results[0].terminated
        assert first.failure_kind == "harbor_gym:reward_file_not_found", first  # issue 16: its own kind
    assert final.reward == 0.0 and final.graded


def _writer_task(tmp_path, *, mode: str | None = None):
    tail = f'[verifier]\nenvironment_mode = "{mode}"\n' if mode else ""
    return write_task(tmp_path, {"task.toml": toml(["s1", "s2"], tail=tail), "tests/test.sh": ALWAYS},
                      name=f"writer-{mode or 'default'}")


# SPEC: TURN-10, VER-7, GYM-11 (P1 condition: with the freeze turned off, a shared-mode background writer beats the
# verifier)
@pytest.mark.docker
def test_p1_background_writer_wins_in_shared_mode_without_freeze(tmp_path):
    results, _ = run_episode(_writer_task(tmp_path), [WRITER, ":"], config(freeze_agent_during_verify=False))
    # This is why the freeze is on by default: README's guarantees state it as a condition of P1.
    assert [r.record.reward for r in results] == [1.0, 1.0]


# SPEC: TURN-10, VER-7, TURN-6, GYM-11 (P1 with no options: the default freeze stops turn 1's writer during the
# verifiers of turns 1 and 2, and a setup.sh ticker too (it holds no listening socket); both are resumed after
# each verifier, before the next activation)
@pytest.mark.parametrize("backend", _backends())
def test_p1_freeze_defeats_a_background_writer_across_turns(tmp_path, backend):
    probe = ("#!/bin/bash\nif [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
             # the setup-started ticker is stopped while the verifier runs
             "a=$(cat /app/ticks); sleep 0.6; b=$(cat /app/ticks); [ \"$a\" = \"$b\" ] && touch /app/ticker-frozen\n"
             "sleep 0.5\n")
    setup = "nohup sh -c 'while :; do date +%s%N > /app/ticks; sleep 0.1; done' >/dev/null 2>&1 &\n"
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": probe,
                                 "steps/s1/workdir/setup.sh": setup}, name="freeze")
    check = ("test -f /app/ticker-frozen && echo ticker-frozen; a=$(cat /app/ticks); "
             "rm -f /logs/verifier/reward.txt; sleep 0.5; test -f /logs/verifier/reward.txt && echo writer-alive; "
             "[ \"$a\" != \"$(cat /app/ticks)\" ] && echo ticker-resumed")
    results, final = run_episode(task, [WRITER, check], config(backend))
    assert [r.record.reward for r in results] == [0.0, 0.0], [r.record for r in results]
    assert all(r.record.reward_valid for r in results) and final.reward == 0.0
    # turn 2's agent saw that the ticker was stopped during verifier 1, and that writer and ticker run again
    tail = results[1].record.output_tail
    assert "ticker-frozen" in tail and "writer-alive" in tail and "ticker-resumed" in tail, tail


# SPEC: VER-3 (P1: in separate mode the verifier's sandbox is fresh: a background writer cannot reach it)
@pytest.mark.docker
def test_p1_separate_mode_defeats_a_background_writer_without_the_option(tmp_path):
    results, final = run_episode(_writer_task(tmp_path, mode="separate"), [WRITER, ":"],
                                 config(freeze_agent_during_verify=False))
    assert [r.record.reward for r in results] == [0.0, 0.0]
    assert all(r.record.verifier_mode == "separate" for r in results) and final.reward == 0.0
