"""The neutral training record: an `EpisodeResult` as the samples a trainer trains on (SPEC GYM-13).

Every model call an episode recorded carries the exact token ids and logprobs the server sent. This module places
them into samples without ever re-tokenising:

- a `TrainingSample` is one token sequence: ``prompt_ids`` (what the policy was first given) and ``completion_ids``
  (everything after: the sampled tokens, and the tool outputs and chat markup between them), with ``loss_mask``
  and ``logprobs`` aligned with ``completion_ids``. ``loss_mask`` is ``1`` exactly on tokens the policy sampled.
- each sample carries the episode reward and, in ``turns``, every turn's reward with the ``[start, end)`` span of
  ``completion_ids`` that turn's calls produced (``None`` when the turn put no token into this sample).

Layouts (`episode_samples`):

- ``"episode"``: one sample per episode. Needs every call's prompt to extend the previous call's prompt and
  completion (one token segment, `harbor_gym.agents.token_segments`); otherwise `LayoutError`.
- ``"turn"``: one sample per turn that made calls; each turn's calls must form one segment, else `LayoutError`.
- ``"call"``: one sample per model call (prompt = that call's prompt ids, completion = its completion ids).
- ``"auto"`` (default): ``"episode"`` when the episode is one segment, else ``"call"``.

No token of a placed call is ever dropped: every call with token ids lands in exactly one sample. A call without
``prompt_token_ids`` or ``completion_token_ids`` (the server gave none) cannot be placed and is listed in
`EpisodeSamples.untokenised_calls`, never guessed.

Episodes that were not graded or are not trainable are marked (``graded``, ``trainable``, ``failure_kind``), their
reward left ``None``, never replaced by a made-up value; a trainer that needs a number decides (see
`harbor_gym.integrations`). Everything here is frozen, picklable plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from harbor_gym.agents import ModelCall, token_segments
from harbor_gym.episode import EpisodeResult, TurnRecord

__all__ = ["CallRef", "TurnSpan", "TrainingSample", "EpisodeSamples", "LayoutError", "LAYOUTS",
           "episode_samples", "rollout_samples", "episode_trainable", "token_rewards"]

#: The sample layouts `episode_samples` accepts.
LAYOUTS = ("auto", "episode", "turn", "call")


class LayoutError(ValueError):
    """The episode's tokens cannot be laid out as asked (e.g. ``layout="episode"`` but a later prompt does not
    extend the sequence). The message names the task, the turn (step) and the call."""


@dataclass(frozen=True)
class CallRef:
    """Where a model call sits: ``turn`` (0-based index into ``EpisodeResult.turns``), ``step_name`` and ``call``
    (0-based index into that turn's ``model_calls``)."""

    turn: int
    step_name: str
    call: int


@dataclass(frozen=True)
class TurnSpan:
    """One turn's reward and where its tokens sit in a sample.

    Attributes:
        index, step_name: which turn (``index`` into ``EpisodeResult.turns``).
        reward: the turn's reward (``None``: the turn has none: masked, ungraded).
        trainable: `harbor_gym.episode.TurnRecord.trainable`.
        failure_kind: the turn's failure kind, ``None`` when none.
        start, end: the ``[start, end)`` range of the sample's ``completion_ids`` holding the tokens this turn's
            calls added (new prompt tokens such as the instruction or tool output, and the completions); ``None``
            when the turn put no token into the sample (a span starting at the sample's ``prompt_ids`` counts
            from 0: the prompt itself is not part of any span).
    """

    index: int
    step_name: str
    reward: int | float | None
    trainable: bool
    failure_kind: str | None
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class TrainingSample:
    """One token sequence to train on.

    Attributes:
        task_id: the task.
        prompt_ids: the prompt ids of the sample's first call, as the server sent them.
        completion_ids: every token after the prompt: completions (sampled) and, between calls, the new prompt
            tokens (tool output, chat markup, the next turn's instruction).
        loss_mask: aligned with ``completion_ids``: ``1`` on sampled tokens, ``0`` elsewhere.
        logprobs: aligned with ``completion_ids``: the server's logprob on sampled tokens, ``0.0`` on mask-0
            tokens; ``None`` when some call of the sample came without logprobs.
        reward: the episode reward (``None``: not graded).
        turns: every turn of the episode (`TurnSpan`), spans relative to this sample.
        step_names: the step names of the turns whose tokens are in this sample, in order, without repeats.
        calls: the calls this sample holds, in order (`CallRef`).
        trainable: `episode_trainable` of the episode (the same for every sample of one episode).
        graded: the episode was graded.
        failure_kind: the episode's failure kind, ``None`` when none.
        layout: ``"episode"``, ``"turn"`` or ``"call"``.
        index, count: this sample's position among the episode's samples.
    """

    task_id: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    reward: int | float | None
    turns: tuple[TurnSpan, ...]
    step_names: tuple[str, ...]
    calls: tuple[CallRef, ...]
    trainable: bool
    graded: bool
    failure_kind: str | None
    layout: str
    index: int = 0
    count: int = 1


@dataclass(frozen=True)
class EpisodeSamples:
    """All samples of one episode, and what the episode was.

    Attributes:
        task_id: the task.
        samples: the samples (``()`` when the episode made no call with token ids, or never ran).
        layout: the layout used (``"auto"`` resolved to ``"episode"`` or ``"call"``).
        reward: the episode reward (``None``: not graded).
        graded, trainable, failure_kind: as on each sample.
        turns: every turn of the episode without spans (``start``/``end`` ``None``).
        untokenised_calls: calls that came without token ids and so are in no sample.
    """

    task_id: str
    samples: tuple[TrainingSample, ...]
    layout: str
    reward: int | float | None
    graded: bool
    trainable: bool
    failure_kind: str | None
    turns: tuple[TurnSpan, ...] = ()
    untokenised_calls: tuple[CallRef, ...] = ()


def episode_trainable(episode: EpisodeResult) -> bool:
    """GYM-13: an episode is trainable iff its reward was measured (graded, a measured 0.0 counts) or it ended in
    an outage the agent caused (GYM-12, reward 0.0); masked, ungraded and infrastructure-outage episodes are not."""
    if episode.agent_caused:
        return True
    return bool(episode.graded) and not episode.masked and episode.reward is not None


def _turn_spans(turns: Sequence[TurnRecord]) -> tuple[TurnSpan, ...]:
    return tuple(TurnSpan(i, t.step_name, t.reward, bool(t.trainable), t.failure_kind) for i, t in enumerate(turns))


def _flat_calls(turns: Sequence[TurnRecord]) -> tuple[list[CallRef], list[ModelCall]]:
    refs: list[CallRef] = []
    calls: list[ModelCall] = []
    for ti, turn in enumerate(turns):
        for ci, call in enumerate(turn.model_calls):
            refs.append(CallRef(ti, turn.step_name, ci))
            calls.append(ModelCall.coerce(call))
    return refs, calls


def _placed(call: ModelCall) -> bool:
    return call.prompt_token_ids is not None and call.completion_token_ids is not None


def _sample(episode: EpisodeResult, spans: tuple[TurnSpan, ...], refs: list[CallRef], calls: list[ModelCall],
            layout: str, trainable: bool) -> TrainingSample:
    """One sample from ``calls``, which form one token segment (each prompt extends the sequence so far)."""
    prompt = calls[0].prompt_token_ids or ()
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    turn_range: dict[int, list[int]] = {}
    length = len(prompt)
    for ref, call in zip(refs, calls):
        new_prompt = (call.prompt_token_ids or ())[length:]
        completion = call.completion_token_ids or ()
        start = len(ids)
        ids += [*new_prompt, *completion]
        mask += [0] * len(new_prompt) + [1] * len(completion)
        if logprobs is not None:
            if call.logprobs is None or len(call.logprobs) != len(completion):
                logprobs = None
            else:
                logprobs += [0.0] * len(new_prompt) + list(call.logprobs)
        length = len(prompt) + len(ids)
        r = turn_range.setdefault(ref.turn, [start, len(ids)])
        r[1] = len(ids)
    turns = tuple(TurnSpan(s.index, s.step_name, s.reward, s.trainable, s.failure_kind,
                           *(turn_range[s.index] if s.index in turn_range else (None, None))) for s in spans)
    names = tuple(dict.fromkeys(ref.step_name for ref in refs))
    return TrainingSample(
        task_id=episode.task_id, prompt_ids=tuple(prompt), completion_ids=tuple(ids), loss_mask=tuple(mask),
        logprobs=None if logprobs is None else tuple(logprobs), reward=episode.reward, turns=turns,
        step_names=names, calls=tuple(refs), trainable=trainable, graded=bool(episode.graded),
        failure_kind=episode.failure_kind, layout=layout)


def _one_segment(task_id: str, refs: list[CallRef], calls: list[ModelCall], what: str) -> None:
    segments = token_segments(calls)
    if len(segments) > 1:
        first_of_second = refs[segments[1].calls[0]]
        raise LayoutError(
            f"task {task_id!r}: {what}: the prompt of call {first_of_second.call} of step "
            f"{first_of_second.step_name!r} does not extend the token sequence so far (the chat template "
            f"re-rendered the history); use layout='call' or 'auto' (GYM-13)")


def episode_samples(episode: EpisodeResult, *, layout: str = "auto") -> EpisodeSamples:
    """GYM-13: the episode's training samples in ``layout`` (see the module docstring).

    Raises:
        LayoutError: ``layout`` is ``"episode"`` or ``"turn"`` and the calls do not form one segment as needed.
        ValueError: an unknown ``layout``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r} (GYM-13)")
    spans = _turn_spans(episode.turns)
    trainable = episode_trainable(episode)
    all_refs, all_calls = _flat_calls(episode.turns)
    missing = tuple(r for r, c in zip(all_refs, all_calls) if not _placed(c))
    pairs = [(r, c) for r, c in zip(all_refs, all_calls) if _placed(c)]
    refs, calls = [p[0] for p in pairs], [p[1] for p in pairs]
    if layout == "auto":
        layout = "episode" if len(token_segments(calls)) <= 1 else "call"
    groups: list[tuple[list[CallRef], list[ModelCall]]] = []
    if layout == "episode" and calls:
        _one_segment(episode.task_id, refs, calls, "layout='episode'")
        groups.append((refs, calls))
    elif layout == "turn":
        for ti in range(len(episode.turns)):
            turn_pairs = [(r, c) for r, c in pairs if r.turn == ti]
            if turn_pairs:
                group = ([p[0] for p in turn_pairs], [p[1] for p in turn_pairs])
                _one_segment(episode.task_id, *group, f"layout='turn', step {episode.turns[ti].step_name!r}")
                groups.append(group)
    elif layout == "call":
        groups = [([r], [c]) for r, c in pairs]
    built = [_sample(episode, spans, g_refs, g_calls, layout, trainable) for g_refs, g_calls in groups]
    samples = tuple(_renumber(s, i, len(built)) for i, s in enumerate(built))
    return EpisodeSamples(task_id=episode.task_id, samples=samples, layout=layout, reward=episode.reward,
                          graded=bool(episode.graded), trainable=trainable, failure_kind=episode.failure_kind,
                          turns=spans, untokenised_calls=missing)


def _renumber(sample: TrainingSample, index: int, count: int) -> TrainingSample:
    return replace(sample, index=index, count=count)


def rollout_samples(rollout: Any, *, layout: str = "auto") -> EpisodeSamples:
    """`episode_samples` of a `harbor_gym.run.collector.RolloutResult` (or anything with ``task_id``,
    ``episode`` and ``failure_kind``). A rollout whose episode never ran (refused or failed at seed, the env
    raised) gives no samples, ``graded=False``, ``trainable=False`` and the rollout's failure kind."""
    episode = getattr(rollout, "episode", None)
    if episode is not None:
        return episode_samples(episode, layout=layout)
    return EpisodeSamples(task_id=str(rollout.task_id), samples=(), layout=layout, reward=None, graded=False,
                          trainable=False, failure_kind=getattr(rollout, "failure_kind", None))


def token_rewards(sample: TrainingSample, *, default: float = 0.0) -> list[float]:
    """Per-token rewards aligned with ``sample.completion_ids``: each turn's reward on the last sampled token
    (``loss_mask`` 1) of its span, ``0.0`` elsewhere. A turn with no reward (``None``) contributes ``default``;
    a turn whose span holds no sampled token contributes nothing."""
    out = [0.0] * len(sample.completion_ids)
    for turn in sample.turns:
        if turn.start is None or turn.end is None:
            continue
        last = next((i for i in range(turn.end - 1, turn.start - 1, -1) if sample.loss_mask[i] == 1), None)
        if last is not None:
            out[last] += float(default if turn.reward is None else turn.reward)
    return out
