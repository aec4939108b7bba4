"""GYM-12: an agent that breaks its own sandbox does not erase its failure. Its turn is ``agent_caused`` (reward
0.0, the cause named), ``harbor-gym run`` does not retry it and counts it as a failed rollout, and the summary's
all-rollouts mean counts it as 0. Real Docker; the run is a ``harbor-gym run`` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harbor_gym.run.summary import summarize

from .helpers import LABEL_FILTER, REPO, config, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

OUTAGE = "harbor_gym:sandbox_outage"


def _task(tmp_path, name: str, *, tail: str = ""):
    return write_task(tmp_path, {"task.toml": toml(["s1", "s2"], tail=tail),
                                 "tests/test.sh": grade("[ -f /app/done ]")}, name=name)


# SPEC: GYM-12 (root `kill -9 -1` and `kill -TERM 1` end the sandbox: agent-caused, reward 0.0, still retryable)
@pytest.mark.parametrize("attack", ["kill -9 -1; sleep 5", "kill -TERM 1; sleep 5"], ids=["kill-all", "term-pid1"])
def test_gym_12_agent_killing_its_sandbox_is_agent_caused(tmp_path, attack):
    results, final = run_episode(_task(tmp_path, "killer"), ["touch /app/done; " + attack, ":"], config())
    record = results[-1].record
    assert len(results) == 1 and results[0].truncated
    assert record.failure_kind == OUTAGE and record.agent_caused and record.reward == 0.0, record
    assert record.outage_cause.startswith("died"), record.outage_cause
    assert record.trainable and "agent-caused" in record.failure_message and "died" in record.failure_message
    assert final.agent_caused and final.outage_cause == record.outage_cause
    assert not final.graded and final.reward is None and final.retryable  # TURN-8: retryable; run does not retry


# SPEC: GYM-12 (a non-root `kill -9 -1` leaves the sandbox alive but killed the harness's wrapper: agent-caused)
def test_gym_12_non_root_kill_all_is_agent_caused_though_the_sandbox_lives(tmp_path):
    task = _task(tmp_path, "nonroot-killer", tail='user = "nobody"\n')
    results, final = run_episode(task, ["touch /tmp/x; kill -9 -1; sleep 5", ":"], config())
    record = results[-1].record
    assert len(results) == 1 and results[0].truncated
    assert record.agent_caused and record.outage_cause == "harness_killed" and record.reward == 0.0, record
    assert final.agent_caused and not final.graded


#: Turn 1 (root) replaces the image's mktemp, which the harness's exec wrapper calls before it says its command's
#: pid, by one that SIGKILLs every process whose argv carries the marker: the next turn's script dies with its wrapper
#: before it starts, while every other command (the probe of GYM-12 included) runs. The marker is split in the file,
#: so the fake's own tools never carry it.
_KILL_NEXT_SCRIPT = r"""cp /usr/bin/mktemp /usr/bin/mktemp.real
cat > /usr/bin/mktemp <<'FAKE'
#!/bin/sh
for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
  case "$c" in *HG""MARK*) kill -9 "${p#/proc/}" 2>/dev/null;; esac
done
exec /usr/bin/mktemp.real "$@"
FAKE
chmod 755 /usr/bin/mktemp"""


# SPEC: GYM-12 (a wrapper killed by the sandbox before it said its pid is the agent's doing, not an engine outage
# to retry: the engine saw it die of a signal, and the probe command still runs)
def test_gym_12_a_wrapper_killed_before_its_pid_is_agent_caused(tmp_path):
    results, final = run_episode(_task(tmp_path, "early-killer"), [_KILL_NEXT_SCRIPT, "touch /app/done # HGMARK"],
                                 config())
    assert len(results) == 2 and results[0].record.reward == 0.0, results
    record = results[-1].record
    assert record.failure_kind == OUTAGE and record.agent_caused, record
    assert record.outage_cause == "harness_killed" and record.reward == 0.0 and record.trainable, record
    assert final.agent_caused and not final.graded


# SPEC: GYM-12 (a normal failing agent and a clean run are never agent-caused)
def test_gym_12_ordinary_turns_are_not_agent_caused(tmp_path):
    results, final = run_episode(_task(tmp_path, "plain"), ["exit 3", "touch /app/done"], config())
    assert [r.record.reward for r in results] == [0.0, 1.0]
    assert not any(r.record.agent_caused or r.record.outage_cause for r in results) and not final.agent_caused


# SPEC: GYM-12 (harbor-gym run -k 8 with an agent that crashes its sandbox half the time: each rollout once, no crash
# retried, every crash agent-caused, the all-rollouts mean is successes / 8)
def test_gym_12_run_counts_crashes_as_failed_rollouts_and_never_retries_them(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": grade("[ -f /app/done ]")},
                      name="coin-crash")
    script = tmp_path / "agent.sh"
    script.write_text("if [ $((RANDOM % 2)) = 0 ]; then kill -9 -1; sleep 5; fi\ntouch /app/done\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "run", str(task), "--agent", f"script:{script}",
                           "-k", "8", "-c", "2", "--backend", "docker", "--out", str(out), "--label", LABEL_FILTER],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    graded = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "rollouts.jsonl").exists() else []
    failed = [json.loads(x) for x in (out / "rollouts_failures.jsonl").read_text().splitlines() if x.strip()] \
        if (out / "rollouts_failures.jsonl").exists() else []
    assert sorted(r["rollout"] for r in graded + failed) == list(range(8)), proc.stderr[-3000:]
    assert all(r["reward"] == 1.0 and r["schema_version"] == 2 for r in graded)
    assert all(r["agent_caused"] and r["outage_cause"].startswith("died") for r in failed), failed
    assert all(r["attempt"] == 1 for r in graded + failed)  # no crash was retried
    assert proc.returncode == (1 if failed else 0), proc.stderr[-3000:]
    (summary,) = summarize(graded, failed)
    assert summary.mean_reward_all == len(graded) / 8 and summary.agent_outages == len(failed)
    assert f"{len(graded) / 8:.3f}" in proc.stdout, proc.stdout
