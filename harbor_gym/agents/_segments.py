"""`token_segments`: a sequence of model calls as token segments with a loss mask (SPEC GYM-13).

A segment is one token sequence the policy saw and produced: the first call's prompt ids (mask 0) and completion
ids (mask 1), then, for each following call whose prompt ids *extend* the segment so far (its first
``len(segment)`` ids are exactly the segment's ids), the new prompt ids (mask 0: tool outputs, templates) and its
completion ids (mask 1). A call whose prompt does not extend the segment (chat templates often re-render history)
starts a new segment: tokens are never spliced or re-tokenised. A call without ``prompt_token_ids`` or
``completion_token_ids`` cannot be placed; it is skipped and the next call starts a new segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from harbor_gym.agents._model_calls import ModelCall

__all__ = ["TokenSegment", "token_segments"]


@dataclass(frozen=True)
class TokenSegment:
    """One contiguous token sequence.

    Attributes:
        token_ids: prompt and completion ids in order.
        loss_mask: ``1`` exactly on completion (policy-sampled) tokens, ``0`` on prompt and tool-output tokens.
        logprobs: aligned with ``token_ids``: the server's logprob on completion tokens, ``0.0`` on mask-0 tokens;
            ``None`` when some completion of the segment came without logprobs.
        calls: indices (into the ``model_calls`` given) of the calls the segment holds.
    """

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    calls: tuple[int, ...]


class _Builder:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = []
        self.calls: list[int] = []

    def add(self, index: int, prompt_new: tuple[int, ...], call: ModelCall) -> None:
        completion = call.completion_token_ids or ()
        self.ids += [*prompt_new, *completion]
        self.mask += [0] * len(prompt_new) + [1] * len(completion)
        if self.logprobs is not None:
            if call.logprobs is None or len(call.logprobs) != len(completion):
                self.logprobs = None
            else:
                self.logprobs += [0.0] * len(prompt_new) + list(call.logprobs)
        self.calls.append(index)

    def build(self) -> TokenSegment:
        return TokenSegment(tuple(self.ids), tuple(self.mask),
                            None if self.logprobs is None else tuple(self.logprobs), tuple(self.calls))


def token_segments(model_calls: Iterable[ModelCall | Mapping[str, Any]]) -> list[TokenSegment]:
    """GYM-13: the calls' tokens as segments (see the module docstring); ``[]`` when no call has token ids."""
    segments: list[TokenSegment] = []
    current: _Builder | None = None
    for index, raw in enumerate(model_calls):
        call = ModelCall.coerce(raw)
        prompt, completion = call.prompt_token_ids, call.completion_token_ids
        if prompt is None or completion is None:
            if current is not None:
                segments.append(current.build())
            current = None
            continue
        if current is not None and len(prompt) >= len(current.ids) and list(prompt[:len(current.ids)]) == current.ids:
            current.add(index, prompt[len(current.ids):], call)
            continue
        if current is not None:
            segments.append(current.build())
        current = _Builder()
        current.add(index, prompt, call)
    if current is not None:
        segments.append(current.build())
    return segments
