"""The OpenAI side of the capture proxy (pure): what a harness's request becomes upstream (rewrites and the token
options of `harbor_gym.agents._chat_wire`), what of the upstream's answer the harness sees (only what it asked
for), and the `ModelCall` a call becomes (SPEC GYM-13; issue 18 item 1).

Token options: the proxy asks for ``logprobs`` and ``return_token_ids`` on every call (minus those the upstream
refused before, `RefusedOptions`), and for ``return_tokens_as_token_ids`` only when the harness asked for it or did
not ask for logprobs (it would change the logprob tokens the harness sees). Streams also ask for
``stream_options.include_usage``. What the harness did not ask for is stripped from its answer: ``logprobs`` (set
to ``null``), ``prompt_token_ids``/``token_ids``, and, in streams, ``usage`` (a chunk left with nothing is dropped).
The record keeps everything.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from harbor_gym.agents._chat_wire import TOKEN_OPTIONS, ParsedResponse
from harbor_gym.agents._model_calls import ModelCall

__all__ = ["Asked", "prepare_request", "strip_response", "strip_chunk", "build_record", "BadRequest"]

_TOKEN_FIELDS = ("prompt_token_ids", "token_ids")


class BadRequest(ValueError):
    """A request the proxy refuses before forwarding (answered 400, recorded ``error``)."""


@dataclass(frozen=True)
class Asked:
    """Which of the proxy's extra answer fields the harness asked for itself."""

    logprobs: bool = False
    token_ids: bool = False
    as_token_ids: bool = False
    usage: bool = False

    def has(self, option: str) -> bool:
        """Whether the harness asked for the token option ``option`` itself."""
        return {"logprobs": self.logprobs, "return_token_ids": self.token_ids,
                "return_tokens_as_token_ids": self.as_token_ids}.get(option, False)


def prepare_request(body: Any, *, model: str | None, extra_body: Mapping[str, Any], refused: frozenset[str]
                    ) -> tuple[dict[str, Any], Asked, set[str]]:
    """The upstream body of a harness's Chat Completions request.

    Args:
        body: the harness's request body (parsed JSON).
        model: the model name to force (``None``: the harness's).
        extra_body: fields forced on every request.
        refused: token options the upstream refused before (not asked again unless the harness asks itself).

    Returns:
        ``(upstream_body, asked, added)``: ``added`` names the token options the proxy put in on its own (those
        it may drop when the upstream refuses them).

    Raises:
        BadRequest: not an object, no list of message objects, or ``n`` other than 1 (only one choice is recorded).
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a list of message objects")
    if body.get("n") not in (None, 1):
        raise BadRequest("n must be 1: the capture proxy records one choice per call")
    stream = bool(body.get("stream"))
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    asked = Asked(logprobs=bool(body.get("logprobs")), token_ids=bool(body.get("return_token_ids")),
                  as_token_ids=bool(body.get("return_tokens_as_token_ids")),
                  usage=bool(options.get("include_usage")))
    out = dict(body)  # top-level keys only change; the nested values are the harness's, never changed
    out.update(copy.deepcopy(dict(extra_body)))
    if model is not None:
        out["model"] = model
    added: set[str] = set()
    for name, value in TOKEN_OPTIONS.items():
        if asked.has(name) or name in refused:
            continue
        if name == "return_tokens_as_token_ids" and asked.logprobs:
            continue
        out[name] = value
        added.add(name)
    if stream:
        out["stream"] = True
        out["stream_options"] = {**options, "include_usage": True}
    return out, asked, added


def without_options(body: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """``body`` without the token options ``names`` (after the upstream refused them)."""
    return {k: v for k, v in body.items() if k not in names}


def _copy_levels(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` whose top level, ``choices`` list and choice objects (the levels stripping changes) are
    new; deeper values are shared, and never changed."""
    out = dict(data)
    if isinstance(out.get("choices"), list):
        out["choices"] = [dict(c) if isinstance(c, Mapping) else c for c in out["choices"]]
    return out


def _strip_choice(choice: Any, asked: Asked) -> None:
    if not isinstance(choice, dict):
        return
    if not asked.logprobs and "logprobs" in choice:
        choice["logprobs"] = None
    if not asked.token_ids:
        for name in _TOKEN_FIELDS:
            choice.pop(name, None)


def strip_response(data: Mapping[str, Any], asked: Asked) -> dict[str, Any]:
    """A copy of a ``chat.completion`` without the fields the harness did not ask for."""
    out = _copy_levels(data)
    if not asked.token_ids:
        out.pop("prompt_token_ids", None)
    for choice in out.get("choices") or ():
        _strip_choice(choice, asked)
    return out


def strip_chunk(chunk: Mapping[str, Any], asked: Asked) -> dict[str, Any] | None:
    """A copy of a ``chat.completion.chunk`` without the fields the harness did not ask for; ``None`` when nothing
    the harness asked for is left (the usage-only chunk it did not ask for)."""
    out = _copy_levels(chunk)
    if not asked.token_ids:
        out.pop("prompt_token_ids", None)
    if not asked.usage:
        had_usage = out.pop("usage", None) is not None
        if had_usage and not out.get("choices"):
            return None
    for choice in out.get("choices") or ():
        _strip_choice(choice, asked)
    return out


def build_record(sent: Mapping[str, Any] | None, parsed: ParsedResponse | None, *, api: str, stream: bool,
                 status: str, error: str | None, latency_s: float) -> tuple[ModelCall, list[dict[str, Any]]]:
    """The `ModelCall` of one call and its full request messages (the session turns them into a delta).

    Args:
        sent: the body sent upstream (``None``: the request never got that far).
        parsed: what arrived (``None``: nothing readable).
    """
    sent = sent or {}
    messages = [dict(m) for m in sent.get("messages") or () if isinstance(m, Mapping)]
    seed = sent.get("seed")
    # ``sent`` is built from freshly parsed JSON that nothing else holds: its values are shared, not copied
    params = {k: v for k, v in sent.items() if k not in ("messages", "model", "seed")}
    model = sent.get("model")
    fields: dict[str, Any] = {}
    if parsed is not None:
        fields = dict(response_text=parsed.text, tool_calls=parsed.tool_calls, finish_reason=parsed.finish_reason,
                      usage=parsed.usage, prompt_token_ids=parsed.prompt_token_ids,
                      completion_token_ids=parsed.completion_token_ids, logprobs=parsed.logprobs)
    call = ModelCall(latency_s=latency_s, seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
                     model=model if isinstance(model, str) else None, params=params, status=status, stream=stream,
                     api=api, error=error, **fields)
    return call, messages
