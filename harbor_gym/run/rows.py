"""The rollout row schema: `RolloutRow` (one graded episode), `FailureRow` (an episode that ended ungraded or
masked, or a task that failed to load) and `TurnRow`, plus `rows_from_episode`, the one place that turns the env's
info records (``info["turn"]``, ``info["episode_result"]``, SPEC GYM-6/8) into rows.

Both ``harbor-gym run`` and `harbor_gym.wrappers.RecordRollouts` build their rows here, so the files they write
are the same. STOP-5: a step-1 preparation failure (``graded = False``) is a failure row, never a rollout row.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "TASK_LOAD_FAILED",
    "SEED_FAILED",
    "SEED_REFUSED",
    "ENV_ERROR",
    "TurnRow",
    "RolloutRow",
    "FailureRow",
    "rows_from_episode",
    "turn_row",
    "episode_seed",
    "is_pass",
]

#: Version of the row schema; bumped on any incompatible change (2: ``agent_caused``/``outage_cause``, GYM-12).
SCHEMA_VERSION = 2
#: ``failure_kind`` of a task that failed to load inside a dataset (LOAD-*); its row has ``rollout = None``.
TASK_LOAD_FAILED = "harbor_gym:task_load_failed"
#: ``failure_kind`` of an episode whose ``reset()`` raised `SeedError` (GYM-2) on every attempt.
SEED_FAILED = "harbor_gym:seed_failed"
#: ``failure_kind`` of an episode refused at seed (`SeedRefusedError`, LOAD-20..24; never retried).
SEED_REFUSED = "harbor_gym:seed_refused"
#: ``failure_kind`` of an episode whose env raised something else (e.g. an agent that cannot be built).
ENV_ERROR = "harbor_gym:env_error"

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def is_pass(reward: float | None) -> bool:
    """A turn passes iff its reward is at least 1.0 (the summary's per-step pass rate)."""
    return reward is not None and reward >= 1.0


def episode_seed(base_seed: int, task_id: str, rollout: int) -> int:
    """The reset seed of rollout ``rollout`` of ``task_id`` under ``--seed base_seed``: stable across runs and
    machines (a hash, not Python's salted ``hash``), in ``[0, 2**31)``."""
    digest = hashlib.sha256(f"{base_seed}\x00{task_id}\x00{rollout}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**31)


class TurnRow(BaseModel):
    """One turn of an episode (from the env's ``info["turn"]`` TurnRecord, GYM-8)."""

    model_config = _FROZEN

    step_name: str = Field(description="The step this turn ran.")
    index: int = Field(description="0-based turn index.")
    reward: int | float | None = Field(description="Turn reward (RWD-5; its JSON type kept, an int stays an int); "
                                                   "None when masked/ungraded (no reward), or under harbor "
                                                   "semantics when the reward file has no reward key.")
    verifier_rewards: dict[str, int | float] = Field(description="The reward file's values, JSON types kept ({} when "
                                                                 "none counts).")
    reward_valid: bool = Field(description="A valid reward file was read (RWD-1..3).")
    masked: bool = Field(description="The turn was masked (VER-11).")
    failure_kind: str | None = Field(description="e.g. harbor:step_setup_failed; None when none.")
    failure_message: str | None = Field(None, description="One line naming the task, the step and the cause when "
                                                          "failure_kind is set or the turn was masked, else None.")
    min_reward_missed: bool = Field(description="STOP-2..4.")
    verifier_mode: str | None = Field(description="shared/separate when the verifier ran, else None.")
    agent_status: str | None = Field(description="completed/timeout/error; None when the agent did not run.")
    agent_exit_code: int | None = Field(description="Exit code of the agent's command, when known.")
    durations_sec: dict[str, float] = Field(description="Phase -> seconds (prepare, agent, artifacts, verify, turn).")
    log_dir: str | None = Field(description="Host folder of the turn: verifier/ (test-stdout.txt, reward file, "
                                            "artifacts/ with manifest.json) and agent/ (the agent's output).")
    agent_caused: bool = Field(False, description="GYM-12: the turn ended in an outage the agent caused (reward 0.0).")
    outage_cause: str | None = Field(None, description="GYM-12: what the agent did (died, oom_killed, "
                                                       "storage_exceeded, cannot_run_commands, harness_killed).")
    model_calls: int = Field(0, description="GYM-13: how many model calls the turn recorded (the agent's own and "
                                            "those its capture proxy saw, issue 18); the calls themselves, token ids "
                                            "and logprobs included, are in trajectories.jsonl.")
    model_calls_refused: int = Field(0, description="Issue 18: calls to the episode's capture proxy refused during "
                                                    "this turn's span because no activation window was open.")
    freeze_exempt: list[str] = Field(default_factory=list, description="GYM-11: executables of the processes left "
                                     "running while this turn's shared verifier ran, because they held a listening "
                                     "socket (freeze_agent_during_verify='auto'); such a process could have written "
                                     "the reward. Empty when nothing was exempt.")


class _EpisodeKey(BaseModel):
    model_config = _FROZEN

    schema_version: Literal[2] = Field(SCHEMA_VERSION, description="Row schema version.")
    task_id: str = Field(description="The task (its folder name, FMT-3).")
    rollout: int | None = Field(description="Rollout index within the task (0-based); None for a load failure.")
    seed: int | None = Field(description="The seed given to reset(); None when not known.")
    agent: str = Field(description="The agent: 'oracle', 'script:FILE', 'module:Class', or a class name.")
    attempt: int = Field(1, description="1-based attempt that produced this row (retries of outages/deadlines).")
    backend: str | None = Field(None, description="The sandbox backend the run used ('docker' or 'local'; the CLI's "
                                                  "'auto' decides it once, before anything runs); None when not known.")


class RolloutRow(_EpisodeKey):
    """One graded episode (a line of ``rollouts.jsonl``)."""

    reward: int | float = Field(description="Roll-up episode reward (RWD-7/8): a float for mean; final passes the "
                                            "last turn's value through, an int included.")
    verifier_rewards: dict[str, int | float] = Field(description="Per-key roll-up (JSON types kept under final).")
    strategy: str = Field(description="mean or final.")
    stopped_after_turn: str | None = Field(description="STOP-9: the last turn that ran iff some step did not run.")
    failure_kind: str | None = Field(None, description="Set only when the episode ended on a failed turn.")
    duration_sec: float = Field(description="Wall-clock seconds of the episode (reset to the last step).")
    log_dir: str | None = Field(description="Host folder of the episode (result.json, steps/<name>/...).")
    turns: list[TurnRow] = Field(description="Every turn that ran, in order.")


class FailureRow(_EpisodeKey):
    """An episode that ended ungraded or masked, or a task that failed to load (a line of
    ``rollouts_failures.jsonl``)."""

    reason: str = Field(description="Why, in one line (the failure kind and what the engine or loader said).")
    failure_kind: str | None = Field(description="e.g. harbor:step_setup_failed, harbor_gym:sandbox_outage, "
                                                 "harbor_gym:task_load_failed, harbor_gym:seed_failed.")
    masked: bool = Field(False, description="The episode was masked (RWD-9).")
    retryable: bool = Field(False, description="The failure was retryable (then: its retries were exhausted).")
    duration_sec: float | None = Field(None, description="Wall-clock seconds, when an episode ran.")
    log_dir: str | None = Field(None, description="Host folder of the episode, when one ran.")
    turns: list[TurnRow] = Field(default_factory=list, description="The turns that ran, in order.")
    agent_caused: bool = Field(False, description="GYM-12: the episode ended in an outage the agent caused; "
                                                  "harbor-gym run does not retry it unless --retry-agent-outages.")
    outage_cause: str | None = Field(None, description="GYM-12: what the agent did, when agent_caused.")


def _number(value: Any) -> int | float:
    """A reward value with its JSON type kept: an ``int`` stays an ``int`` (issue 16), anything else a float."""
    return value if isinstance(value, int) and not isinstance(value, bool) else float(value)


def _record_attr(record: Any, name: str, default: Any = None) -> Any:
    return getattr(record, name, default)


def turn_row(record: Any) -> TurnRow:
    """The `TurnRow` of a TurnRecord (``info["turn"]``)."""
    return TurnRow(
        step_name=record.step_name,
        index=int(record.index),
        reward=record.reward,
        verifier_rewards={str(k): _number(v) for k, v in dict(record.verifier_rewards).items()},
        reward_valid=bool(record.reward_valid),
        masked=bool(record.masked),
        failure_kind=record.failure_kind,
        failure_message=_record_attr(record, "failure_message"),
        min_reward_missed=bool(record.min_reward_missed),
        verifier_mode=record.verifier_mode,
        agent_status=record.agent_status,
        agent_exit_code=record.exit_code,
        durations_sec={str(k): round(float(v), 4) for k, v in dict(_record_attr(record, "timings", {})).items()},
        log_dir=_record_attr(record, "log_dir"),
        agent_caused=bool(_record_attr(record, "agent_caused", False)),
        outage_cause=_record_attr(record, "outage_cause"),
        model_calls=len(_record_attr(record, "model_calls", ()) or ()),
        model_calls_refused=int(_record_attr(record, "model_calls_refused", 0) or 0),
        freeze_exempt=[str(getattr(e, "exe", e)) for e in _record_attr(record, "freeze_exempt", ()) or ()],
    )


def _reason(result: Any) -> str:
    kind = result.failure_kind or ("masked" if result.masked else "ungraded")
    last = result.turns[-1] if result.turns else None
    where = f" at turn {last.step_name!r}" if last is not None else ""
    detail = ""
    if last is not None and getattr(last, "mask_reason", None):
        detail = f" (mask reason: {last.mask_reason})"
    message = getattr(result, "failure_message", None) or (getattr(last, "failure_message", None) if last else None)
    return f"{kind}{where}{detail}" + (f": {message}" if message else "")


def rows_from_episode(
    result: Any,
    *,
    records: Iterable[Any] | None = None,
    task_id: str,
    rollout: int | None,
    seed: int | None,
    agent: str,
    attempt: int = 1,
    duration_sec: float,
    backend: str | None = None,
) -> RolloutRow | FailureRow:
    """The row of a finished episode: a `RolloutRow` iff it was graded and not masked, else a `FailureRow`.

    Args:
        result: the EpisodeResult of ``info["episode_result"]``.
        records: the TurnRecords seen in ``info["turn"]`` (default: ``result.turns``; they are the same objects).
        backend: the sandbox backend used (``docker``/``local``), recorded in the row.
    """
    turns = [turn_row(r) for r in (records if records is not None else result.turns)]
    common = dict(task_id=task_id, rollout=rollout, seed=seed, agent=agent, attempt=attempt, backend=backend)
    if result.graded and not result.masked and result.reward is not None:
        return RolloutRow(
            **common,
            reward=_number(result.reward),
            verifier_rewards={str(k): _number(v) for k, v in dict(result.verifier_rewards).items()},
            strategy=str(result.strategy),
            stopped_after_turn=result.stopped_after_turn,
            failure_kind=result.failure_kind,
            duration_sec=round(duration_sec, 3),
            log_dir=result.log_dir,
            turns=turns,
        )
    return FailureRow(
        **common,
        reason=_reason(result),
        failure_kind=result.failure_kind,
        masked=bool(result.masked),
        retryable=bool(result.retryable),
        duration_sec=round(duration_sec, 3),
        log_dir=result.log_dir,
        turns=turns,
        agent_caused=bool(getattr(result, "agent_caused", False)),
        outage_cause=getattr(result, "outage_cause", None),
    )
