"""One model call through the capture proxy: read the harness's request, forward it upstream, pass the answer back
(whole or chunk by chunk) and say what to record (issue 18 item 1, SPEC GYM-10/GYM-13).

`Exchange.run` is the call's own asyncio task, so that `ProxySession.end_activation` can cancel it at any point
(reading the request, waiting on the upstream, streaming); what had arrived stays on the `Exchange` and
`Exchange.cut` turns it into the ``cancelled`` record. The upstream client never follows a redirect, never reads
proxy settings from the environment, and gets only the headers the proxy builds (never the harness's, so the
session token never goes upstream). The upstream key is read from its variable per call, sent only in the
upstream's ``Authorization`` header, and scrubbed from any upstream text that is passed on or recorded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from harbor_gym.agents._chat_wire import RefusedOptions, named_options, parse_response, parse_stream
from harbor_gym.agents._model_calls import ModelCall
from harbor_gym.proxy import _anthropic as anth
from harbor_gym.proxy._config import ModelUpstream, ProxyLimits
from harbor_gym.proxy._http import ClientGone, HttpConnection, RequestRefused, json_bytes
from harbor_gym.proxy._openai import Asked, BadRequest, build_record, prepare_request, strip_chunk, strip_response
from harbor_gym.proxy._openai import without_options

try:  # the HTTP client the openai SDK itself depends on (named httpx2 in its newer releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases
    import httpx  # type: ignore[no-redef]

__all__ = ["Exchange", "CallFailed", "error_payload", "UpstreamContext", "httpx"]

_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                       404: "not_found_error", 408: "timeout", 413: "request_too_large", 429: "rate_limit_error",
                       431: "request_too_large"}
#: An upstream error text passed on or recorded is cut to this many characters.
_ERROR_TEXT = 300


def error_payload(api: str, status: int, message: str) -> dict[str, Any]:
    """The error body of ``api``'s shape."""
    if api == "anthropic":
        return anth.error_body(status, message)
    return {"error": {"message": message, "type": _OPENAI_ERROR_TYPES.get(status, "api_error"), "param": None,
                      "code": None}}


def _stream_error(api: str, status: int, message: str) -> bytes:
    if api == "anthropic":
        return anth.StreamTranslator.error(status, message)
    return b"data: " + json_bytes(error_payload(api, status, message)) + b"\n\n"


class CallFailed(Exception):
    """The call ends with ``status`` to the harness and an ``error`` record."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class UpstreamContext:
    """What every call of one proxy shares: the upstream, its client, the caps, and the byte meter of a window."""

    upstream: ModelUpstream
    limits: ProxyLimits
    client: Any  # httpx.AsyncClient

    def key(self) -> str | None:
        """The upstream key, read now from the variable named by ``api_key_env``."""
        name = self.upstream.api_key_env
        value = os.environ.get(name) if name else None
        return value or None

    def scrub(self, text: str) -> str:
        """``text`` cut to one short line, without the upstream key."""
        key = self.key()
        if key:
            text = text.replace(key, "[redacted]")
        text = " ".join(text.split())
        return text[:_ERROR_TEXT]

    def scrub_bytes(self, data: bytes) -> bytes:
        """``data`` without the upstream key (whole; for bodies passed on as they are)."""
        key = self.key()
        return data.replace(key.encode(), b"[redacted]") if key else data


@dataclass(eq=False)
class Exchange:
    """One call (see the module docstring). ``charge(nbytes) -> bool`` meters the activation's traffic."""

    ctx: UpstreamContext
    conn: HttpConnection
    request: Any  # h11.Request
    api: str
    charge: Callable[[int], bool]
    started: float = field(default_factory=time.monotonic)
    sent: dict[str, Any] | None = None
    stream: bool = False
    chunks: list[dict[str, Any]] = field(default_factory=list)
    #: the record of a call whose whole answer arrived (kept even if passing it on to the harness is cut)
    final: tuple[ModelCall, list[dict[str, Any]]] | None = None
    _asked: Asked = field(default_factory=Asked)
    _added: set[str] = field(default_factory=set)
    _response_bytes: int = 0

    # --- what to record --------------------------------------------------------------------------------
    def _record(self, parsed: Any, status: str, error: str | None) -> tuple[ModelCall, list[dict[str, Any]]]:
        return build_record(self.sent, parsed, api=self.api, stream=self.stream, status=status, error=error,
                            latency_s=time.monotonic() - self.started)

    def _partial(self) -> Any:
        if not self.chunks:
            return None
        try:
            return parse_stream(self.chunks)
        except ValueError:
            return None

    def cut(self, reason: str) -> tuple[ModelCall, list[dict[str, Any]]]:
        """The record of a call cut before its end: ``ok`` if its whole answer had arrived from the upstream, else
        ``cancelled`` with what had arrived."""
        return self.final or self._record(self._partial(), "cancelled", reason)

    def failed(self, reason: str) -> tuple[ModelCall, list[dict[str, Any]]]:
        """The ``error`` record of a call that failed, with what had arrived."""
        return self._record(self._partial(), "error", reason)

    async def answer_error(self, status: int, reason: str) -> None:
        """Tell the harness, if it can still hear: an error response, or an error event ending its stream."""
        try:
            if not self.conn.response_started:
                await self.conn.send_response(status, json_bytes(error_payload(self.api, status, reason)),
                                              close=True)
            elif self.conn.can_send:
                await self.conn.send_chunk(_stream_error(self.api, status, reason))
                await self.conn.end_stream()
        except ClientGone:
            pass

    # --- the call ----------------------------------------------------------------------------------------
    async def run(self) -> tuple[ModelCall, list[dict[str, Any]]]:
        """Serve the call and return its record and full request messages.

        Raises:
            ClientGone: the harness went away before its answer (the caller records the call ``cancelled``).
        """
        limits = self.ctx.limits
        try:
            try:
                raw = await self.conn.read_body(self.request, limits.max_request_bytes)
            except RequestRefused as refused:
                raise CallFailed(refused.status, refused.reason) from refused
            self._meter(len(raw))
            body, original = self._upstream_body(raw)
            return await self._forward(body, original)
        except CallFailed as failure:
            await self.answer_error(failure.status, failure.reason)
            return self.failed(failure.reason)

    def _meter(self, nbytes: int) -> None:
        if not self.charge(nbytes):
            raise CallFailed(429, f"the activation's model traffic cap of {self.ctx.limits.max_activation_bytes} "
                                  "bytes was reached (GYM-10)")

    def _upstream_body(self, raw: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        original = _json_object(raw, 400, "the request body")
        try:
            body = anth.to_openai_request(original) if self.api == "anthropic" else original
            self.stream = bool(body.get("stream"))
            sent, self._asked, self._added = prepare_request(
                body, model=self.ctx.upstream.model, extra_body=self.ctx.upstream.extra_body,
                refused=RefusedOptions.get(self.ctx.upstream.base_url))
        except (anth.TranslationError, BadRequest) as exc:
            raise CallFailed(400, str(exc)) from exc
        self.sent = sent
        return sent, original

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json",
                   "accept": "text/event-stream" if self.stream else "application/json"}
        key = self.ctx.key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def _send(self, body: dict[str, Any]) -> Any:
        url = self.ctx.upstream.base_url + "/chat/completions"
        request = self.ctx.client.build_request("POST", url, content=json_bytes(body), headers=self._headers())
        try:
            return await self.ctx.client.send(request, stream=True, follow_redirects=False)
        except httpx.TimeoutException as exc:
            raise CallFailed(502, f"the upstream did not answer within {self.ctx.upstream.timeout_s:g} s "
                                  f"({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise CallFailed(502, f"the upstream cannot be reached ({type(exc).__name__})") from exc

    async def _read_all(self, response: Any) -> bytes:
        parts = []
        async for piece in self._pieces(response):
            parts.append(piece)
        return b"".join(parts)

    async def _pieces(self, response: Any) -> AsyncIterator[bytes]:
        cap = self.ctx.limits.max_response_bytes
        try:
            async for piece in response.aiter_raw():
                self._response_bytes += len(piece)
                if self._response_bytes > cap:
                    raise CallFailed(502, f"the upstream's answer is over the proxy's cap of {cap} bytes (GYM-10)")
                self._meter(len(piece))
                yield piece
        except httpx.TimeoutException as exc:
            raise CallFailed(502, f"the upstream stalled for over {self.ctx.upstream.timeout_s:g} s "
                                  f"({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise CallFailed(502, f"the upstream's answer broke off ({type(exc).__name__})") from exc

    async def _forward(self, body: dict[str, Any], original: dict[str, Any]) -> tuple[ModelCall, list[dict]]:
        for _ in range(4):  # at most one retry per token option the upstream refuses
            response = await self._send(body)
            try:
                status = response.status_code
                if 300 <= status < 400:
                    raise CallFailed(502, f"the upstream answered a redirect (HTTP {status}); the proxy follows none "
                                          "(GYM-10)")
                if status >= 400:
                    text = (await self._read_all(response)).decode("utf-8", "replace")
                    refused = named_options(text, self._added) if status == 400 else set()
                    if refused:
                        RefusedOptions.add(self.ctx.upstream.base_url, refused)
                        self._added -= refused
                        body = without_options(body, refused)
                        self.sent = body
                        continue
                    raise self._upstream_error(status, text)
                if self.stream:
                    return await self._relay_stream(response, original)
                return await self._relay_whole(response, original)
            finally:
                await response.aclose()
        raise CallFailed(502, "the upstream refused every form of the request")

    def _upstream_error(self, status: int, text: str) -> CallFailed:
        message = text
        try:
            data = json.loads(text)
            inner = data.get("error") if isinstance(data, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                message = inner["message"]
            elif isinstance(data, dict) and isinstance(data.get("message"), str):
                message = data["message"]
        except ValueError:
            pass
        message = self.ctx.scrub(message)
        if status in (401, 403):
            return CallFailed(502, f"the upstream refused the proxy's credentials (HTTP {status})")
        if status >= 500:
            return CallFailed(502, f"the upstream failed (HTTP {status}): {message}")
        return CallFailed(status, f"the upstream answered HTTP {status}: {message}")

    async def _relay_whole(self, response: Any, original: dict[str, Any]) -> tuple[ModelCall, list[dict]]:
        raw = await self._read_all(response)
        try:
            data = json.loads(raw)
            parsed = parse_response(data)
        except ValueError as exc:
            raise CallFailed(502, "the upstream's answer is not a chat completion") from exc
        if self.api == "anthropic":
            out = anth.to_anthropic_message(data, model=original.get("model"),
                                            stop_sequences=original.get("stop_sequences"))
        else:
            out = strip_response(data, self._asked)
        self.final = record = self._record(parsed, "ok", None)
        await self.conn.send_response(200, json_bytes(out))
        return record

    async def _relay_stream(self, response: Any, original: dict[str, Any]) -> tuple[ModelCall, list[dict]]:
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            raise CallFailed(502, "the upstream did not stream its answer")
        translator = (anth.StreamTranslator(model=original.get("model"),
                                            stop_sequences=original.get("stop_sequences"))
                      if self.api == "anthropic" else None)
        await self.conn.start_stream(200)
        done = False
        async for data in _sse_data(self._pieces(response)):
            if done:  # read to the end, so that the upstream connection is kept for the next call
                continue
            if data == "[DONE]":
                done = True
                continue
            chunk = _json_object(data, 502, "an event the upstream streamed")
            if "error" in chunk and not chunk.get("choices"):
                raise CallFailed(502, f"the upstream's stream failed: {self.ctx.scrub(json.dumps(chunk['error']))}")
            self.chunks.append(chunk)
            if translator is not None:
                for event in translator.feed(chunk):
                    await self.conn.send_chunk(event)
            else:
                stripped = strip_chunk(chunk, self._asked)
                if stripped is not None:
                    await self.conn.send_chunk(b"data: " + json_bytes(stripped) + b"\n\n")
        if not done:
            raise CallFailed(502, "the upstream's stream ended without [DONE]")
        try:
            parsed = parse_stream(self.chunks)
        except ValueError as exc:
            raise CallFailed(502, "the upstream's stream held no choice") from exc
        self.final = record = self._record(parsed, "ok", None)
        for event in (translator.finish() if translator is not None else [b"data: [DONE]\n\n"]):
            await self.conn.send_chunk(event)
        await self.conn.end_stream()
        return record


def _json_object(data: bytes | str, status: int, what: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object, else `CallFailed` with ``status`` naming ``what``."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise CallFailed(status, f"{what} is not JSON") from exc
    except RecursionError as exc:  # nesting deeper than the interpreter's stack: hostile, refused like bad JSON
        raise CallFailed(status, f"{what} nests too deeply") from exc
    if not isinstance(value, dict):
        raise CallFailed(status, f"{what} is not a JSON object")
    return value


async def _sse_data(pieces: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event in ``pieces`` (multi-line data joined with newlines)."""
    buffer = bytearray()
    data: list[str] = []
    async for piece in pieces:
        start = len(buffer)
        buffer += piece
        while True:
            cut = buffer.find(b"\n", start)
            if cut < 0:
                break
            line = bytes(buffer[:cut]).rstrip(b"\r")
            del buffer[:cut + 1]
            start = 0
            if not line:
                if data:
                    yield "\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[5:].decode("utf-8", "replace").lstrip(" "))
    if data:
        yield "\n".join(data)
