"""`ModelCall`: one model call of an activation, as plain picklable data (SPEC GYM-13), and `full_requests`.

How an agent hands its calls to the engine: ``turn.record_model_call(call)`` as each call returns (what ChatAgent
does; calls recorded before a budget overrun are kept), or ``AgentOutcome(model_calls=...)`` at the end. The turn
record's ``model_calls`` holds the recorded calls, then the outcome's, in that order.

Request messages are stored as a *delta* (``messages_offset``): a call's full request is the previous call's full
request cut to its first ``messages_offset`` messages, followed by this call's ``request_messages``. The first call of
a sequence (``messages_offset == 0``) holds its whole request, so each turn record's calls rebuild on their own
(ChatAgent's first call of every activation is stored whole, also under ``turn_sessions="continue"``).
`full_requests` rebuilds every call's messages.

Token fields hold exactly what the server sent; a field the server did not give is ``None`` and is never rebuilt by
re-tokenising.

How a call ended (``status``): ``ok`` (a whole answer arrived), ``cancelled`` (cut before its end, e.g. by the turn's
budget: the fields hold what had arrived) or ``error`` (the server failed or a cap was hit; ``error`` says which).
``api`` names the protocol the caller spoke (``openai`` Chat Completions, or ``anthropic`` Messages translated by the
capture proxy, `harbor_gym.proxy`); ``stream`` whether the answer was streamed. Records written before these fields
existed read back as ``ok``, ``openai``, not streamed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["ModelCall", "full_requests", "message_delta", "CALL_STATUSES", "CALL_APIS"]

#: How a call ended: a whole answer, cut before its end, or failed (`ModelCall.status`).
CALL_STATUSES = ("ok", "cancelled", "error")
#: The protocol the caller spoke (`ModelCall.api`).
CALL_APIS = ("openai", "anthropic")


def _ints(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def _floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(v) for v in value)


@dataclass(frozen=True)
class ModelCall:
    """One Chat Completions call (GYM-13). Frozen, picklable; ``to_dict``/``from_dict`` round-trip through JSON.

    Attributes:
        request_messages: the messages this call added to the request (see ``messages_offset``).
        messages_offset: how many leading messages of the previous call's full request this request repeats
            (``0``: ``request_messages`` is the whole request).
        response_text: the assistant message's text (``None``: none).
        tool_calls: ``({"id", "name", "arguments"}, ...)``, ``arguments`` the raw JSON string the model produced.
        finish_reason: as the server gave it (``stop``, ``length``, ``tool_calls``...), ``None`` if absent.
        usage: the server's ``usage`` object, ``None`` if absent.
        latency_s: wall seconds of the HTTP call (retries of a refused parameter included).
        prompt_token_ids, completion_token_ids: token ids as the server sent them, else ``None``.
        logprobs: one float per completion token, as sent, else ``None``.
        seed: the per-call sampling seed sent (``None``: none sent).
        model: the model name asked for.
        params: the other request parameters sent (``temperature``, ``max_tokens``, the token options...).
        status: ``"ok"``, ``"cancelled"`` or ``"error"`` (see the module docstring).
        stream: whether the answer was streamed.
        api: ``"openai"`` or ``"anthropic"``: the protocol the caller spoke.
        error: why a call is not ``ok`` (one line, never a secret), else ``None``.
    """

    request_messages: tuple[Mapping[str, Any], ...] = ()
    messages_offset: int = 0
    response_text: str | None = None
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    latency_s: float = 0.0
    prompt_token_ids: tuple[int, ...] | None = None
    completion_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    seed: int | None = None
    model: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    status: str = "ok"
    stream: bool = False
    api: str = "openai"
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_messages", tuple(dict(m) for m in self.request_messages))
        object.__setattr__(self, "tool_calls", tuple(dict(c) for c in self.tool_calls))
        object.__setattr__(self, "usage", None if self.usage is None else dict(self.usage))
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "prompt_token_ids", _ints(self.prompt_token_ids))
        object.__setattr__(self, "completion_token_ids", _ints(self.completion_token_ids))
        object.__setattr__(self, "logprobs", _floats(self.logprobs))
        if self.messages_offset < 0:
            raise ValueError("ModelCall.messages_offset must be >= 0 (GYM-13)")
        if self.status not in CALL_STATUSES:
            raise ValueError(f"ModelCall.status must be one of {CALL_STATUSES}, got {self.status!r} (GYM-13)")
        if self.api not in CALL_APIS:
            raise ValueError(f"ModelCall.api must be one of {CALL_APIS}, got {self.api!r} (GYM-13)")
        object.__setattr__(self, "stream", bool(self.stream))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data of every field (tuples as lists)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
            elif isinstance(value, Mapping):
                value = copy.deepcopy(dict(value))
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelCall":
        """The inverse of `to_dict` (unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def coerce(cls, value: "ModelCall | Mapping[str, Any]") -> "ModelCall":
        """``value`` itself, or a `ModelCall` rebuilt from its `to_dict` form."""
        return value if isinstance(value, ModelCall) else cls.from_dict(value)


def message_delta(previous: Sequence[Mapping[str, Any]] | None,
                  messages: Sequence[Mapping[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """``(messages_offset, request_messages)`` of ``messages`` against the previous full request ``previous``:
    the longest common prefix is left out. ``previous=None``: ``(0, all of messages)``."""
    if not previous:
        return 0, [dict(m) for m in messages]
    n = 0
    for a, b in zip(previous, messages):
        if dict(a) != dict(b):
            break
        n += 1
    return n, [dict(m) for m in messages[n:]]


def full_requests(model_calls: Iterable[ModelCall | Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """GYM-13: the full ``messages`` list of every call, rebuilt from the deltas (in order).

    Raises:
        ValueError: a call's ``messages_offset`` is longer than the previous call's request (the calls are not one
            sequence, e.g. a list that does not start at a call with ``messages_offset == 0``).
    """
    out: list[list[dict[str, Any]]] = []
    previous: list[dict[str, Any]] = []
    for i, raw in enumerate(model_calls):
        call = ModelCall.coerce(raw)
        if call.messages_offset > len(previous):
            raise ValueError(f"model call {i}: messages_offset {call.messages_offset} exceeds the previous request's "
                             f"{len(previous)} messages (GYM-13)")
        current = [copy.deepcopy(m) for m in previous[:call.messages_offset]]
        current += [copy.deepcopy(dict(m)) for m in call.request_messages]
        out.append(current)
        previous = current
    return out
