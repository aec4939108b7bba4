"""GYM-11 (the freeze's pure parts: its mode, the parse of its notes) and GYM-12/item 4 (the verdicts of an
engine defect and of outages), without Docker."""

from __future__ import annotations

from harbor_gym.episode._freeze import freeze_mode, parse_exempt
from harbor_gym.episode._outage import WatchedExec, agent_outage_cause
from harbor_gym.episode._records import ExemptProcess, TurnRecord
from harbor_gym.episode._shell import parse
from harbor_gym.episode._stop import (
    ENGINE_ERROR_KIND,
    WORKDIR_DELETED_KIND,
    WORKDIR_MISSING_KIND,
    TurnFault,
    decide_turn,
)
from harbor_gym.sandbox.base import ExecResult, SandboxState


# SPEC: GYM-11
def test_gym_11_modes():
    assert freeze_mode("auto") == "auto" and freeze_mode(True) == "strict" and freeze_mode(False) is None


# SPEC: GYM-11 (anything a process controls in the freeze's output never crashes the engine)
def test_gym_11_exempt_notes_parse_without_raising():
    m = "@@HGabc"
    out = (f"{m} exempt 12 /usr/bin/python3.11\n{m} exempt 13 /opt/my server/bin ?x\n{m} exempt x /bin/sh\n"
           f"{m} exempt\n{m} frozen 3\n")
    assert parse_exempt(parse(out, m)) == (ExemptProcess(12, "/usr/bin/python3.11"),
                                           ExemptProcess(13, "/opt/my server/bin ?x"))
    assert parse_exempt(None) == () and parse_exempt(parse("garbage\n\0\n", m)) == ()


# SPEC: GYM-11 (the exempt list pickles through to_dict and back)
def test_gym_11_record_round_trip():
    rec = TurnRecord(task_id="t", step_name="s", index=0, instruction="i", reward=None, verifier_rewards={},
                     reward_valid=False, masked=False, verifier_mode=None, failure_kind="harbor_gym:sandbox_outage",
                     min_reward_missed=False, agent_status=None, exit_code=None, output_tail=None,
                     freeze_exempt=(ExemptProcess(7, "/bin/x"),), agent_caused=True, outage_cause="died (exit 137)")
    data = rec.to_dict()
    assert data["freeze_exempt"] == [{"pid": 7, "exe": "/bin/x"}] and data["agent_caused"] is True
    assert TurnRecord(**data).freeze_exempt == (ExemptProcess(7, "/bin/x"),)


# SPEC: GYM-12 item 4 (an error inside harbor_gym at a turn boundary is ungraded and never retryable)
def test_engine_error_is_ungraded_and_not_retryable():
    v = decide_turn(TurnFault.ENGINE_ERROR, is_first=False, is_last=False)
    assert v.ends and v.truncated and not v.graded and not v.retryable and v.failure_kind == ENGINE_ERROR_KIND
    assert decide_turn(TurnFault.OUTAGE, is_first=False, is_last=False).retryable  # TURN-8 unchanged


# SPEC: GYM-12 (issue 16: a missing workdir is the task's fault; one deleted after an earlier step the agent's)
def test_workdir_missing_and_deleted_verdicts():
    for harbor in (False, True):
        missing = decide_turn(TurnFault.WORKDIR_MISSING, is_first=True, is_last=False, harbor=harbor)
        assert missing.ends and missing.terminated and not missing.truncated and not missing.graded
        assert not missing.retryable and missing.failure_kind == WORKDIR_MISSING_KIND  # no DIFF-4 retry
        deleted = decide_turn(TurnFault.WORKDIR_DELETED, is_first=False, is_last=False, harbor=harbor)
        assert deleted.ends and deleted.truncated and not deleted.graded and deleted.retryable  # as GYM-12 outages
        assert deleted.failure_kind == WORKDIR_DELETED_KIND


class _Box:
    def __init__(self, *, alive=True, state=SandboxState.RUNNING, ok=True, storage=False):
        self.alive, self.state, self.ok, self.storage = alive, state, ok, storage

    def is_alive(self):
        return self.alive

    def storage_exceeded(self):
        return self.storage

    def exec(self, *a, **k):
        return ExecResult(exit_code=0 if self.ok else 1)


# SPEC: GYM-12 (without an engine: died, cannot run commands, storage; a sandbox we stopped never counts)
def test_gym_12_outage_cause_without_an_engine():
    assert agent_outage_cause(_Box(alive=False)) == "died"
    assert agent_outage_cause(_Box(ok=False)) == "cannot_run_commands"
    assert agent_outage_cause(_Box(storage=True)) == "storage_exceeded"
    assert agent_outage_cause(_Box()) is None
    assert agent_outage_cause(_Box(alive=False, state=SandboxState.STOPPED)) is None
    assert agent_outage_cause(None) is None


# SPEC: GYM-12 (an activation command whose wrapper was killed marks the activation)
def test_gym_12_watched_exec_notes_a_lost_wrapper():
    watched = WatchedExec(lambda *a, **k: ExecResult(exit_code=0))
    watched("true", timeout=1)
    assert not watched.wrapper_lost
    watched = WatchedExec(lambda *a, **k: ExecResult(exit_code=137, wrapper_lost=True))
    watched("kill -9 -1", timeout=1)
    assert watched.wrapper_lost
