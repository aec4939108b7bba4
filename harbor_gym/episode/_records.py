"""Frozen, picklable results of the turn engine: `TurnRecord`, `EpisodeResult`, `TurnResult`, `ManifestEntry`
(SPEC GYM-8, ART-4). Each has ``to_dict()`` giving JSON-able data."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from harbor_gym.agents._model_calls import ModelCall
from harbor_gym.agents._outcome import AgentOutcome

__all__ = [
    "TurnRecord", "EpisodeResult", "TurnResult", "ManifestEntry", "ExemptProcess", "turn_trainable", "outcome_fields",
]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class ManifestEntry:
    """One artifact entry of a turn (ART-4): where it came from and what became of it.

    ``origin`` is ``convention``, ``task`` or ``step`` (``None`` under ``semantics="harbor"``, DIFF-13).
    """

    source: str
    destination: str
    type: str  # "file" | "directory"
    status: str  # "ok" | "failed" | "empty" | "skipped" | "truncated" (GYM-10: a cap cut something)
    service: str | None = None
    exclude: tuple[str, ...] = ()
    origin: str | None = None
    #: GYM-10: links found in the entry (path relative to the entry -> target), recorded, never followed.
    links: dict[str, str] = field(default_factory=dict, hash=False)
    #: GYM-10: paths not copied (fifo, device, socket, bad name, budget), path -> why.
    refused: dict[str, str] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """ART-4's JSON object for this entry (``origin`` left out under Harbor; ``links``/``refused`` only when
        there are some)."""
        data = {"source": self.source, "destination": self.destination, "type": self.type, "status": self.status,
                "service": self.service, "exclude": list(self.exclude)}
        if self.origin is not None:
            data["origin"] = self.origin
        if self.links:
            data["links"] = dict(self.links)
        if self.refused:
            data["refused"] = dict(self.refused)
        return data


@dataclass(frozen=True)
class ExemptProcess:
    """A process the freeze left running during a shared-mode verifier because it held a listening socket (GYM-11,
    ``freeze_agent_during_verify="auto"``): its pid in the sandbox and its executable's path (``/proc/<pid>/exe``;
    non-printable bytes shown as ``?``; ``?`` when unreadable)."""

    pid: int
    exe: str

    @classmethod
    def coerce(cls, value: Any) -> "ExemptProcess":
        """An `ExemptProcess` from itself or its ``to_dict`` form."""
        return value if isinstance(value, cls) else cls(pid=int(value["pid"]), exe=str(value["exe"]))


@dataclass(frozen=True)
class TurnRecord:
    """What one turn did (GYM-8).

    Attributes:
        task_id, step_name, index: which turn (``index`` 0-based).
        instruction: what the agent received (TURN-9).
        reward: the turn reward (RWD-5); ``0.0`` for a measured 0; ``None`` when the turn has no reward (masked,
            ungraded, or no result under Harbor).
        verifier_rewards: the reward file's values (``{}`` when none counts).
        reward_valid: a valid reward file was read (RWD-1..3).
        masked, mask_reason: the turn was masked (VER-11) and why.
        verifier_mode: ``shared``/``separate`` when the verifier ran, else ``None``.
        failure_kind: e.g. ``harbor:step_setup_failed``, ``harbor_gym:sandbox_outage``; ``None`` when none.
        min_reward_missed: STOP-2..4.
        agent_status: ``completed``/``timeout``/``error``, ``None`` when the agent did not run.
        exit_code, output_tail: of the agent's command, when known.
        manifest: the artifact manifest (ART-4).
        log_dir: the turn's host log folder when ``EnvConfig.logs_root`` is set, else ``None``.
        timings: phase name -> seconds.
        failure_message: one line naming the task, the step and the cause, whenever ``failure_kind`` is set or the
            turn was masked (``mask_reason`` keeps its short code); ``None`` otherwise. Never holds env values.
        outcome: the activation's `AgentOutcome` (status, policy, response, exit code, ATIF trajectory steps,
            metadata) as plain picklable data, its ``model_calls`` moved to the field below; ``None`` when the
            agent did not run (GYM-13).
        model_calls: this activation's model calls (`harbor_gym.agents.ModelCall`), in order (GYM-13): those the
            agent recorded itself (``turn.record_model_call``, then its outcome's), then those the episode's capture
            proxy saw during the activation window (issue 18, ``EnvConfig.model_upstream``).
        model_calls_refused: issue 18: calls to the episode's capture proxy refused during this turn's span (from
            the end of the previous turn, or the seed, to the end of this one) because no activation window was
            open: made by a process left running between turns, during preparation, setup.sh or verification.
            They are never in ``model_calls`` and never reached the upstream. ``0`` without a model upstream.
        trainable: `turn_trainable` (GYM-13): false for masked, ungraded and infrastructure-outage turns, true for
            measured and agent-caused ones.
        agent_caused: GYM-12: the turn ended in an outage the agent caused (while the engine answered, the sandbox
            died, ran out of memory or pids, exceeded its storage or could no longer run commands, at any point from
            the episode's first activation; or the activation killed the harness's own processes, ``kill -9 -1``).
            Its ``reward`` is 0.0. An unreachable or restarted engine is never agent-caused.
        outage_cause: GYM-12: what the agent did, when ``agent_caused``: ``died`` (with the exit status when the
            engine knows it), ``oom_killed``, ``storage_exceeded``, ``cannot_run_commands``, ``harness_killed``;
            ``None`` otherwise.
        freeze_exempt: GYM-11: the processes left running while a shared-mode verifier ran because they held a
            listening socket (``freeze_agent_during_verify="auto"``); ``()`` when none or no freeze.
    """

    task_id: str
    step_name: str
    index: int
    instruction: str
    reward: int | float | None
    verifier_rewards: dict[str, int | float]
    reward_valid: bool
    masked: bool
    verifier_mode: str | None
    failure_kind: str | None
    min_reward_missed: bool
    agent_status: str | None
    exit_code: int | None
    output_tail: str | None
    manifest: tuple[ManifestEntry, ...] = ()
    log_dir: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    mask_reason: str | None = None
    failure_message: str | None = None
    outcome: AgentOutcome | None = None
    model_calls: tuple[ModelCall, ...] = ()
    trainable: bool | None = None
    agent_caused: bool = False
    outage_cause: str | None = None
    freeze_exempt: tuple[ExemptProcess, ...] = ()
    model_calls_refused: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "freeze_exempt", tuple(ExemptProcess.coerce(e) for e in self.freeze_exempt))
        # GYM-13: records rebuilt from to_dict() (Ray callers, rollout files) get their frozen parts back.
        object.__setattr__(self, "outcome", AgentOutcome.coerce(self.outcome))
        object.__setattr__(self, "model_calls", tuple(ModelCall.coerce(c) for c in self.model_calls))
        if self.trainable is None:
            object.__setattr__(self, "trainable", turn_trainable(self))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def turn_trainable(record: Any) -> bool:
    """GYM-13: a turn is trainable iff its reward was measured (graded, not masked; a measured 0.0 counts) or it
    is an agent-caused outage (GYM-12); masked, ungraded and infrastructure-outage turns are not."""
    if getattr(record, "agent_caused", False):
        return True
    return not record.masked and record.reward is not None


def outcome_fields(outcome: AgentOutcome | None, recorded: tuple[ModelCall, ...] = ()) -> dict[str, Any]:
    """GYM-13: the ``outcome`` and ``model_calls`` fields of a turn's record: the activation's outcome without its
    calls, and the calls recorded on the `Turn` followed by the outcome's own."""
    if outcome is None:
        return {"outcome": None, "model_calls": tuple(recorded)}
    calls = tuple(recorded) + tuple(outcome.model_calls)
    return {"outcome": dataclasses.replace(outcome, model_calls=()), "model_calls": calls}


@dataclass(frozen=True)
class EpisodeResult:
    """The episode's outcome (GYM-8).

    Attributes:
        task_id: the task.
        reward: the roll-up (RWD-7/8), ``None`` when masked or ungraded.
        verifier_rewards: per-key roll-up.
        strategy: ``mean`` or ``final``.
        verifier_mode: RWD-10.
        turns: every turn that ran, in order.
        stopped_after_turn: STOP-9.
        masked, graded, failure_kind, retryable: STOP-5..8, RWD-9, BUD-8.
        response: the last response of a turn whose agent ran (STOP-9).
        log_dir: the episode's host log folder when ``logs_root`` is set, else ``None``.
        timings: phase name -> seconds, summed over the episode (``seed`` included).
        failure_message: the ending turn's ``failure_message`` (task, step and cause) when the episode ended on a
            failed or masked turn; ``None`` otherwise and in a provisional result.
        agent_caused, outage_cause: the ending turn's (GYM-12): the episode ended in an outage the agent caused.
    """

    task_id: str
    reward: int | float | None
    verifier_rewards: dict[str, int | float]
    strategy: str
    verifier_mode: str | None
    turns: tuple[TurnRecord, ...]
    stopped_after_turn: str | None
    masked: bool
    graded: bool
    failure_kind: str | None
    retryable: bool
    response: str | None = None
    log_dir: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    failure_message: str | None = None
    agent_caused: bool = False
    outage_cause: str | None = None

    @property
    def freeze_exempt_turns(self) -> tuple[int, ...]:
        """GYM-11: the indices of the turns whose shared verifier ran while a process of the sandbox was left
        running because it held a listening socket (``freeze_agent_during_verify="auto"``): their rewards could
        have been written by that process. Empty when no turn needed the exemption."""
        return tuple(t.index for t in self.turns if t.freeze_exempt)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (turns as dicts; ``freeze_exempt_turns`` follows from them)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class TurnResult:
    """What ``Episode.run_turn`` returns: the turn's record, the Gymnasium flags, and the episode's result when
    this turn ended it (GYM-6/7)."""

    record: TurnRecord
    terminated: bool
    truncated: bool
    episode: EpisodeResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record.to_dict(), "terminated": self.terminated, "truncated": self.truncated,
                "episode": self.episode.to_dict() if self.episode is not None else None}
