"""The wire side of `ChatAgent`: which token options a request carries, what a response's tokens are, per-call
seeds, and which endpoints refused which options (SPEC GYM-13).

Token options, as vLLM's OpenAI-compatible server documents them (SGLang accepts the same ``logprobs``):

- ``logprobs: true``: ``choices[0].logprobs.content[i].logprob`` for every completion token;
- ``return_token_ids: true`` (vLLM >= 0.10.2, in the request body): top-level ``prompt_token_ids`` and
  ``choices[0].token_ids`` (the completion ids); both also accepted inside the choice;
- ``return_tokens_as_token_ids: true``: each ``logprobs.content[i].token`` is ``"token_id:N"``, so the completion
  ids are read from the logprobs when ``token_ids`` is absent.

Streamed (``chat.completion.chunk`` objects, `parse_stream`): ``prompt_token_ids`` from whichever chunk carries it
(vLLM: the first), each chunk's ``choices[0].token_ids`` and ``logprobs.content`` concatenated in order, the text and
tool-call deltas joined, ``usage`` from the final chunk (``stream_options.include_usage``).

A server that answers 400 naming one of these options is asked again once without it, and the option is left out of
every later request to that endpoint (``base_url``) in this process (`RefusedOptions`). Nothing is re-tokenised: a
field the server did not send stays ``None``.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = ["TOKEN_OPTIONS", "RefusedOptions", "ParsedResponse", "parse_response", "parse_stream", "call_seed",
           "named_options"]

#: The token options a request carries (name -> value), in the body (``extra_body``) or as a top-level argument.
TOKEN_OPTIONS: dict[str, Any] = {"logprobs": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
_TOKEN_ID_PREFIX = "token_id:"


class RefusedOptions:
    """Per endpoint, the token options it refused with a 400 (process-wide, thread-safe)."""

    _lock = threading.Lock()
    _refused: dict[str, set[str]] = {}

    @classmethod
    def get(cls, endpoint: str) -> frozenset[str]:
        with cls._lock:
            return frozenset(cls._refused.get(endpoint, ()))

    @classmethod
    def add(cls, endpoint: str, names: set[str]) -> None:
        with cls._lock:
            cls._refused.setdefault(endpoint, set()).update(names)

    @classmethod
    def forget(cls, endpoint: str | None = None) -> None:
        """Forget what ``endpoint`` (``None``: every endpoint) refused."""
        with cls._lock:
            if endpoint is None:
                cls._refused.clear()
            else:
                cls._refused.pop(endpoint, None)


def named_options(message: str, sent: set[str]) -> set[str]:
    """The token options of ``sent`` that a 400's ``message`` names (``return_tokens_as_token_ids`` goes with
    ``logprobs``: without logprobs it means nothing)."""
    text = message.lower().replace("top_logprobs", "")
    named = {name for name in sent if name in text}
    if "logprobs" in named:
        named.add("return_tokens_as_token_ids")
    return named & sent


def call_seed(base: int | None, rollout: int | None, turn_index: int, call_index: int) -> int | None:
    """GYM-13: the sampling seed of one call: a stable 31-bit hash of the episode seed, the rollout, the turn and
    the call's number in the activation; ``None`` (no seed sent) when ``base`` is ``None``."""
    if base is None:
        return None
    key = f"{int(base)}/{rollout}/{turn_index}/{call_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class ParsedResponse:
    """What one Chat Completions response said (GYM-13 fields; ``None`` where the server gave nothing)."""

    text: str | None
    tool_calls: tuple[dict[str, Any], ...]
    finish_reason: str | None
    usage: dict[str, Any] | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    logprobs: list[float] | None
    message: dict[str, Any]


def _ids_from_logprob_tokens(content: list[Mapping[str, Any]]) -> list[int] | None:
    ids: list[int] = []
    for entry in content:
        token = entry.get("token") if isinstance(entry, Mapping) else None
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        try:
            ids.append(int(token[len(_TOKEN_ID_PREFIX):]))
        except ValueError:
            return None
    return ids


def parse_response(data: Mapping[str, Any]) -> ParsedResponse:
    """Read a (non-streamed) ``chat.completion`` object.

    Raises:
        ValueError: it has no ``choices[0].message``.
    """
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping) or not isinstance(choices[0].get("message"), Mapping):
        raise ValueError("the response has no choices[0].message")
    choice = choices[0]
    message = dict(choice["message"])
    calls = []
    for raw in message.get("tool_calls") or ():
        fn = raw.get("function") or {}
        calls.append({"id": raw.get("id") or f"call_{len(calls)}", "name": fn.get("name"),
                      "arguments": fn.get("arguments") if isinstance(fn.get("arguments"), str) else
                      ("" if fn.get("arguments") is None else str(fn.get("arguments")))})
    prompt_ids = data.get("prompt_token_ids", choice.get("prompt_token_ids"))
    completion_ids = choice.get("token_ids")
    logprobs = None
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
    if isinstance(content, list) and content:
        values = [c.get("logprob") for c in content if isinstance(c, Mapping)]
        if len(values) == len(content) and all(isinstance(v, (int, float)) for v in values):
            logprobs = [float(v) for v in values]
        if completion_ids is None:
            completion_ids = _ids_from_logprob_tokens(content)
    usage = data.get("usage")
    return ParsedResponse(
        text=message.get("content") if isinstance(message.get("content"), str) else None,
        tool_calls=tuple(calls),
        finish_reason=choice.get("finish_reason"),
        usage=dict(usage) if isinstance(usage, Mapping) else None,
        prompt_token_ids=None if prompt_ids is None else [int(i) for i in prompt_ids],
        completion_token_ids=None if completion_ids is None else [int(i) for i in completion_ids],
        logprobs=logprobs,
        message=message,
    )


def parse_stream(chunks: Iterable[Mapping[str, Any]]) -> ParsedResponse:
    """Read the ``chat.completion.chunk`` objects of a streamed answer as one response (see the module docstring).

    Raises:
        ValueError: no chunk had a choice.
    """
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish, usage, prompt_ids = None, None, None
    ids: list[int] | None = None
    content: list[Any] = []
    seen = False
    for chunk in chunks:
        if isinstance(chunk.get("usage"), Mapping):
            usage = dict(chunk["usage"])
        if chunk.get("prompt_token_ids") is not None:
            prompt_ids = list(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            seen = True
            if choice.get("prompt_token_ids") is not None:
                prompt_ids = list(choice["prompt_token_ids"])
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for raw in delta.get("tool_calls") or ():
                slot = calls.setdefault(int(raw.get("index", len(calls))), {"id": None, "name": None, "arguments": ""})
                fn = raw.get("function") or {}
                slot["id"] = slot["id"] or raw.get("id")
                slot["name"] = slot["name"] or fn.get("name")
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("token_ids") is not None:
                ids = (ids or []) + [int(i) for i in choice["token_ids"]]
            lp = choice.get("logprobs")
            if isinstance(lp, Mapping) and isinstance(lp.get("content"), list):
                content += lp["content"]
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if not seen:
        raise ValueError("the stream had no choices")
    tool_calls = [{"id": c["id"] or f"call_{i}", "name": c["name"], "arguments": c["arguments"]}
                  for i, c in sorted(calls.items())]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if tool_calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in tool_calls]
    choice: dict[str, Any] = {"message": message, "finish_reason": finish,
                              "logprobs": {"content": content} if content else None}
    if ids is not None:
        choice["token_ids"] = ids
    data: dict[str, Any] = {"choices": [choice], "usage": usage}
    if prompt_ids is not None:
        data["prompt_token_ids"] = prompt_ids
    return parse_response(data)
