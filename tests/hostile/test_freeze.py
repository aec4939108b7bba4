"""P1 with no options set (GYM-11): in shared mode, a process the agent leaves behind never gets its forged reward
paid, however it hides from the freeze; services survive the default freeze and are listed in the turn record.
Real episodes on Docker.

Every writer below keeps writing ``1`` into ``/logs/verifier/reward.txt`` while ``test.sh`` writes
``0`` and then sleeps a second: without the freeze the writer wins (`test_reward_forgery`).
"""

from __future__ import annotations

import pytest

from harbor_gym.agents import Oracle

from .helpers import REPO, config, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

_WRITE = "echo 1 > /logs/verifier/reward.txt 2>/dev/null"
_LOOP = f"while :; do {_WRITE}; sleep 0.02; done"

#: name -> the agent's command (turn 1): each leaves a writer behind and returns at once.
WRITERS = {
    "plain": f"nohup sh -c \"{_LOOP}\" >/dev/null 2>&1 &",
    # a new orphan every 20 ms: its pid never stays the same long enough for a listing
    "respawning": ("printf '#!/bin/sh\\n%s\\nsleep 0.02\\nsetsid /tmp/r.sh </dev/null >/dev/null 2>&1 &\\n' "
                   f"\"{_WRITE}\" > /tmp/r.sh; chmod +x /tmp/r.sh; setsid /tmp/r.sh </dev/null >/dev/null 2>&1 &"),
    # process names the kernel prints inside /proc/<pid>/stat: a newline, and a fake stat line
    "newline-name": f"nohup sh -c 'printf \"w\\n9 (x) T 1\" > /proc/$$/comm; {_LOOP}' >/dev/null 2>&1 &",
    "fake-line-name": f"nohup sh -c 'printf \"x) T 1 1 1 1 1\" > /proc/$$/comm; {_LOOP}' >/dev/null 2>&1 &",
    "paren-space-name": f"nohup sh -c 'printf \") ) ) \" > /proc/$$/comm; {_LOOP}' >/dev/null 2>&1 &",
    # double fork into a new session (the grandchild's parent is PID 1)
    "double-fork": f"setsid sh -c '(setsid sh -c \"{_LOOP}\" </dev/null >/dev/null 2>&1 &)' </dev/null >/dev/null 2>&1 &",
    # quiet until test.sh runs, then writes
    "waits-for-test-sh": ("nohup sh -c 'while :; do if pgrep -f /tests/test.sh >/dev/null; then "
                          f"{_WRITE}; fi; sleep 0.01; done' >/dev/null 2>&1 &"),
}

#: A writer that also holds a listening TCP socket (a "service" to the default freeze).
LISTENING_WRITER = ("nohup python3 -c \"import socket, time\n"
                    "s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen()\n"
                    "while True:\n"
                    "    open('/logs/verifier/reward.txt', 'w').write('1')\n"
                    "    time.sleep(0.02)\n\" >/dev/null 2>&1 & "
                    "for i in $(seq 100); do [ -s /logs/verifier/reward.txt ] && break; sleep 0.1; done")


def _task(tmp_path, name: str):
    return write_task(tmp_path, {"task.toml": toml(["s1", "s2"]),
                                 "tests/test.sh": grade("[ -f /app/done ]", then_sleep=1)}, name=name)


# SPEC: GYM-11 (P1 with no options: no writer a shared-mode agent leaves behind is paid; no process name crashes the
# engine; the writer is resumed after each verifier)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_gym_11_default_freeze_defeats_every_leftover_writer(tmp_path, writer):
    check = "rm -f /logs/verifier/reward.txt; sleep 0.5; test -f /logs/verifier/reward.txt && echo writer-alive"
    results, final = run_episode(_task(tmp_path, f"w-{writer}"), [WRITERS[writer], check], config())
    records = [r.record for r in results]
    assert [r.reward for r in records] == [0.0, 0.0], records
    assert all(r.reward_valid and r.failure_kind is None and r.freeze_exempt == () for r in records), records
    assert final.graded and final.reward == 0.0
    if writer != "waits-for-test-sh":  # that one writes only while test.sh runs
        # the writer runs again while turn 2's agent runs (only the stopped set is resumed, before the activation)
        assert "writer-alive" in (records[1].output_tail or ""), records[1]


# SPEC: GYM-11 (auto exempts a process holding a listening socket, lists it, and so pays it: the documented residual
# risk; True stops it)
def test_gym_11_listening_writer_exempt_under_auto_stopped_under_strict(tmp_path):
    results, final = run_episode(_task(tmp_path, "listen-auto"), [LISTENING_WRITER, ":"], config())
    first = results[0].record
    assert first.reward == 1.0, first  # the residual risk README states
    assert len(first.freeze_exempt) == 1 and "python3" in first.freeze_exempt[0].exe, first.freeze_exempt
    # the exemption is visible where a trainer looks: the episode's summary and its rollout row
    assert final.freeze_exempt_turns == tuple(r.record.index for r in results if r.record.freeze_exempt)
    assert 0 in final.freeze_exempt_turns
    from harbor_gym.run.rows import rows_from_episode

    row = rows_from_episode(final, task_id="t", rollout=0, seed=0, agent="script", duration_sec=1.0)
    assert "python3" in row.turns[0].freeze_exempt[0]
    results, _ = run_episode(_task(tmp_path, "listen-strict"), [LISTENING_WRITER, ":"],
                             config(freeze_agent_during_verify=True))
    assert [r.record.reward for r in results] == [0.0, 0.0]
    assert all(r.record.freeze_exempt == () for r in results)


_SERVE = ("mkdir -p /srv/www && echo ok-42 > /srv/www/answer.txt && "
          "setsid python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/www </dev/null >/dev/null 2>&1 & "
          "for i in $(seq 50); do python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8000/', "
          "timeout=1)\" 2>/dev/null && break; sleep 0.1; done")
_CURL = ("#!/bin/bash\npython3 - <<'PY'\nimport urllib.request\ntry:\n"
         "    body = urllib.request.urlopen('http://127.0.0.1:8000/answer.txt', timeout=3).read().decode().strip()\n"
         "except Exception as exc:\n    print('no answer:', exc)\n    body = ''\n"
         "open('/logs/verifier/reward.txt', 'w').write('1' if body == 'ok-42' else '0')\nPY\n")


# SPEC: GYM-11 (a server the agent started survives the default freeze, so test.sh reaches it; True stops it: 0)
def test_gym_11_agent_started_server_is_reached_by_test_sh(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"], verifier_timeout=20), "tests/test.sh": _CURL},
                      name="agent-server")
    results, final = run_episode(task, [_SERVE], config())
    record = results[0].record
    assert record.reward == 1.0 and final.reward == 1.0, record
    assert [p.exe for p in record.freeze_exempt] and "python3" in record.freeze_exempt[0].exe
    results, final = run_episode(task, [_SERVE], config(freeze_agent_during_verify=True))
    assert results[0].record.reward == 0.0 and final.reward == 0.0  # README: strict mode stops services too


# SPEC: GYM-11 (envs/service-check: the service setup.sh started survives the default freeze; True scores 0.5)
def test_gym_11_service_check_scores_one_under_the_default(tmp_path):
    _, final = run_episode(REPO / "envs" / "service-check", Oracle(), config())
    assert final.reward == 1.0, final
    assert all(t.freeze_exempt for t in final.turns), final.turns
    _, final = run_episode(REPO / "envs" / "service-check", Oracle(), config(freeze_agent_during_verify=True))
    assert final.reward == 0.5, final  # step 2's verifier cannot reach the stopped service (README)


# SPEC: GYM-11 (only the stopped set is resumed after the verifier, right after its files crossed to the host: what
# an earlier turn left running keeps running between turns, while the trainer's policy thinks)
def test_gym_11_leftover_processes_run_between_turns(tmp_path):
    import time

    from harbor_gym.episode import Episode
    from harbor_gym.task import load_task

    ticker = "nohup sh -c 'while :; do date +%s%N >> /tmp/ticks; sleep 0.05; done' >/dev/null 2>&1 &"
    cfg = config()
    task = load_task(_task(tmp_path, "ticker"), cfg)
    with Episode(task, cfg) as ep:
        ep.start()
        first = ep.run_turn(ticker).record
        assert first.reward == 0.0 and first.reward_valid, first
        start_ns = time.time_ns()
        time.sleep(1.5)  # between turns: nothing of the episode runs on the host
        stop_ns = time.time_ns()
        second = ep.run_turn("cat /tmp/ticks").record
    ticks = [int(line) for line in (second.output_tail or "").split() if line.isdigit()]
    between = [tick for tick in ticks if start_ns + 200_000_000 <= tick <= stop_ns]
    assert len(between) >= 10, (len(ticks), between[:3])  # ~25 expected at 20 per second
