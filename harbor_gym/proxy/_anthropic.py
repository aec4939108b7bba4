"""Anthropic Messages <-> OpenAI Chat Completions, for the capture proxy (pure; issue 18 item 1).

The proxy speaks Anthropic's ``POST /v1/messages`` to harnesses and forwards to the OpenAI-compatible upstream (one
upstream, so one policy and one tokenizer serve both protocols; the token ids and logprobs the upstream sends are
recorded from its OpenAI answer, and the record's messages are the OpenAI messages the policy saw).

Requests (`to_openai_request`):

- ``system`` (a string or text blocks) -> a leading ``system`` message; ``max_tokens``, ``temperature``, ``top_p``,
  ``top_k``, ``stop_sequences`` (-> ``stop``), ``stream`` carried over; ``metadata``, ``thinking``,
  ``service_tier``, ``cache_control`` and other Anthropic-only fields are dropped;
- ``user`` content: ``text`` blocks -> the message's text (one block: a string, several: text parts), ``image``
  blocks (base64 or url) -> ``image_url`` parts, each ``tool_result`` block -> its own ``tool`` message (in order,
  before the user text that follows it), its content as text;
- ``assistant`` content: ``text`` -> the content, ``tool_use`` -> ``tool_calls`` (``input`` as a JSON string),
  ``thinking``/``redacted_thinking`` dropped;
- ``tools`` (custom tools with an ``input_schema``) -> functions; ``tool_choice`` ``auto``/``any``/``tool``/``none``
  -> ``auto``/``required``/that function/``none``; ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
  Server tools (no ``input_schema``), documents and unknown block types are refused (`TranslationError`, a 400).

Answers (`to_anthropic_message`, `StreamTranslator`): text -> a ``text`` block, each tool call -> a ``tool_use`` block
(arguments parsed as JSON; arguments that are not a JSON object give ``{}``, the raw string stays in the record);
``finish_reason`` ``stop`` -> ``end_turn`` (``stop_sequence`` when the upstream names a matched stop string),
``length`` -> ``max_tokens``, ``tool_calls`` -> ``tool_use``, ``content_filter`` -> ``refusal``; usage
``prompt_tokens``/``completion_tokens`` -> ``input_tokens``/``output_tokens``. Streams follow Anthropic's event
sequence: ``message_start``, per block ``content_block_start``/``content_block_delta`` (``text_delta``,
``input_json_delta``)/``content_block_stop``, ``message_delta`` (stop reason, usage), ``message_stop``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Mapping

from harbor_gym.proxy._http import json_bytes

__all__ = ["TranslationError", "to_openai_request", "to_anthropic_message", "StreamTranslator", "sse_event",
           "error_body", "ERROR_TYPES"]

#: Anthropic's error ``type`` by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               431: "request_too_large", 500: "api_error", 502: "api_error", 503: "overloaded_error",
               504: "api_error"}

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
         "content_filter": "refusal"}
_DROPPED = ("metadata", "thinking", "service_tier", "container", "mcp_servers", "context_management", "betas")


class TranslationError(ValueError):
    """An Anthropic request that has no OpenAI form (answered 400 ``invalid_request_error``)."""


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for an HTTP status."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def sse_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One Anthropic server-sent event."""
    return b"event: " + name.encode() + b"\ndata: " + json_bytes(data) + b"\n\n"


# --- requests ----------------------------------------------------------------------------------------------------
def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise TranslationError(f"{where}: only text blocks are supported here")
            parts.append(block["text"])
        return "\n".join(parts)
    if content is None:
        return ""
    raise TranslationError(f"{where}: content must be a string or a list of blocks")


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise TranslationError(f"{where}: image source must be base64 or url")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result_text(block: Mapping[str, Any], where: str) -> str:
    content = block.get("content")
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, Mapping) and item.get("type") == "text":
                parts.append(str(item.get("text", "")))
            else:
                raise TranslationError(f"{where}: a tool_result may hold only text here")
        text = "\n".join(parts)
    else:
        text = "" if content is None else str(content)
    return text


def _user_messages(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise TranslationError(f"{where}.content must be a string or a list of blocks")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if not parts:
            return
        if all(p["type"] == "text" for p in parts) and len(parts) == 1:
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": list(parts)})
        parts.clear()

    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            flush()
            text = _tool_result_text(block, at)
            if block.get("is_error"):
                text = f"[error] {text}" if text else "[error]"
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text})
        else:
            raise TranslationError(f"{at}: block type {kind!r} is not supported by the capture proxy")
    flush()
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise TranslationError(f"{where}.content must be a string or a list of blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id", f"toolu_{i}")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise TranslationError(f"{where}.content[{i}]: block type {kind!r} is not supported by the capture "
                                   "proxy")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise TranslationError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str) or "input_schema" not in tool:
            raise TranslationError(f"tools[{i}]: only custom tools with a name and an input_schema are supported "
                                   "(server tools are not)")
        fn: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            fn["description"] = str(tool["description"])
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise TranslationError(f"tool_choice {choice!r} is not supported")


def to_openai_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI Chat Completions body of an Anthropic Messages request (see the module docstring).

    Raises:
        TranslationError: a field or block with no OpenAI form, or a malformed request (names the field).
    """
    if not isinstance(body, Mapping):
        raise TranslationError("the request body must be a JSON object")
    messages_in = body.get("messages")
    if not isinstance(messages_in, list) or not messages_in:
        raise TranslationError("messages must be a non-empty list")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise TranslationError("max_tokens (an integer) is required")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, msg in enumerate(messages_in):
        where = f"messages[{i}]"
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if role == "user":
            messages += _user_messages(msg.get("content"), where)
        elif role == "assistant":
            messages.append(_assistant_message(msg.get("content"), where))
        else:
            raise TranslationError(f"{where}.role must be user or assistant, got {role!r}")
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages, "max_tokens": body["max_tokens"]}
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        choice = body["tool_choice"]
        if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
        out["tool_choice"] = _tool_choice(choice)
    if body.get("stream"):
        out["stream"] = True
    return out


# --- answers -----------------------------------------------------------------------------------------------------
def _stop_reason(choice: Mapping[str, Any], stop_sequences: list[str]) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return _STOP.get(finish or "stop", "end_turn"), None


def _input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, Mapping) else {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens")
                                                                                       or 0)}


def message_id() -> str:
    """A fresh Anthropic-style message id."""
    return "msg_" + secrets.token_hex(12)


def to_anthropic_message(data: Mapping[str, Any], *, model: Any, stop_sequences: list[str] | None = None
                         ) -> dict[str, Any]:
    """The Anthropic ``message`` object of an OpenAI ``chat.completion`` (its first choice).

    Raises:
        ValueError: the answer has no ``choices[0].message``.
    """
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping) or not isinstance(choices[0].get("message"), Mapping):
        raise ValueError("the upstream's answer has no choices[0].message")
    choice = choices[0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{i}"), "name": fn.get("name") or "",
                        "input": _input(fn.get("arguments"))})
    reason, sequence = _stop_reason(choice, stop_sequences or [])
    return {"id": message_id(), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(data.get("usage"))}


class StreamTranslator:
    """OpenAI ``chat.completion.chunk`` objects in, Anthropic stream events out, in order.

    `feed` each chunk as it arrives; `finish` once the upstream's stream ended (``[DONE]``). Each returns the
    encoded events (`sse_event`) to send now.
    """

    def __init__(self, *, model: Any, stop_sequences: list[str] | None = None) -> None:
        self._model = model
        self._stops = list(stop_sequences or [])
        self._started = False
        self._block: tuple[str, int] | None = None  # ("text", -1) or ("tool", openai tool index)
        self._index = -1
        self._finish: dict[str, Any] | None = None
        self._usage: Any = None
        self._input_tokens = 0

    def _start(self, out: list[bytes]) -> None:
        if self._started:
            return
        self._started = True
        out.append(sse_event("message_start", {"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": self._model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, "output_tokens": 0}}}))

    def _close_block(self, out: list[bytes]) -> None:
        if self._block is not None:
            out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index}))
            self._block = None

    def _open(self, out: list[bytes], key: tuple[str, int], block: dict[str, Any]) -> None:
        self._close_block(out)
        self._index += 1
        self._block = key
        out.append(sse_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                     "content_block": block}))

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        """The events for one upstream chunk."""
        out: list[bytes] = []
        if isinstance(chunk.get("prompt_token_ids"), list) and not self._started:
            self._input_tokens = len(chunk["prompt_token_ids"])
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = chunk["usage"]
        self._start(out)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._block != ("text", -1):
                    self._open(out, ("text", -1), {"type": "text", "text": ""})
                out.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                             "delta": {"type": "text_delta", "text": text}}))
            for raw in delta.get("tool_calls") or ():
                key = ("tool", int(raw.get("index", 0)))
                fn = raw.get("function") or {}
                if self._block != key:
                    self._open(out, key, {"type": "tool_use", "id": str(raw.get("id") or f"toolu_{key[1]}"),
                                          "name": fn.get("name") or "", "input": {}})
                if fn.get("arguments"):
                    out.append(sse_event("content_block_delta", {
                        "type": "content_block_delta", "index": self._index,
                        "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}}))
            if choice.get("finish_reason"):
                self._finish = dict(choice)
        return out

    def finish(self) -> list[bytes]:
        """The closing events (the open block's stop, ``message_delta``, ``message_stop``)."""
        out: list[bytes] = []
        self._start(out)
        self._close_block(out)
        reason, sequence = _stop_reason(self._finish or {"finish_reason": "stop"}, self._stops)
        usage = _usage(self._usage)
        if not usage["input_tokens"]:
            usage["input_tokens"] = self._input_tokens
        out.append(sse_event("message_delta", {"type": "message_delta",
                                               "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                               "usage": usage}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out

    @staticmethod
    def error(status: int, message: str) -> bytes:
        """An ``error`` event (a stream cut by the proxy or the upstream)."""
        return sse_event("error", error_body(status, message))
