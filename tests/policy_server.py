"""A scripted policy server speaking the OpenAI Chat Completions protocol (FastAPI + uvicorn on 127.0.0.1), answering
in vLLM's response shape: tool calls, top-level ``prompt_token_ids``, ``choices[0].token_ids`` and logprobs whose
tokens are ``"token_id:N"`` (SPEC GYM-13 tests).

The policy reads the conversation, so it answers the same in any process that calls it:

- model ``policy`` (tools mode): the commands are the instruction's lines starting with ``$ ``; it calls ``bash``
  with the next one not yet run (counted by the ``tool`` messages after the last ``user`` message), and once all ran
  replies ``done: <the first line of the last output> (users=<user messages seen>)`` with no tool call;
- ``policy-text``: the same, with each command in a ```` ```bash ```` block and outputs read from ``user`` messages;
- ``policy-nologprobs``: the ``policy`` answers, but a request carrying ``logprobs`` or ``return_token_ids`` gets a
  400 naming the option (as closed APIs do);
- ``policy-loop``: never stops (always one more ``bash`` call, ``echo again``);
- ``policy-slow``: like ``policy-loop`` but each answer takes 1 s;
- ``policy-hang``: never answers (streamed: sends its first chunk, then nothing) until the client goes away, which
  it notes in ``server.disconnects`` (the capture proxy's cancellation tests);
- ``policy-500``: answers HTTP 500; ``policy-redirect``: answers 307 to another host;
- ``policy-echo-auth``: answers 400 quoting the request's ``Authorization`` header (a server that leaks the key).

``GET /v1/models`` lists the models.

A request with ``stream: true`` gets the same answer as vLLM streams it (server-sent ``chat.completion.chunk``s).

Tokens come from a toy tokenizer that renders each message as ``[role id] + bytes of its text``, so the next call's
prompt ids extend the previous prompt + completion exactly (one token segment per conversation). Logprobs are
distinct floats derived from position and seed. Every request body is kept in ``server.requests``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


def render_message(msg: dict[str, Any]) -> list[int]:
    """The toy tokenizer: a role id, then the bytes of the content and tool-call arguments (offset by 10)."""
    text = msg.get("content") or ""
    for call in msg.get("tool_calls") or ():
        text += "\x00" + call["function"]["name"] + "\x00" + call["function"]["arguments"]
    return [ROLE_IDS.get(msg.get("role"), 5)] + [10 + b for b in text.encode()]


def render(messages: list[dict[str, Any]]) -> list[int]:
    return [tok for m in messages for tok in render_message(m)]


def logprob(position: int, seed: int | None) -> float:
    return -((position * 7919 + (seed or 0)) % 1000) / 997.0 - 1e-9 * position


class PolicyServer:
    """The server in a daemon thread; ``url`` is its ``/v1`` base."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []  # the Authorization header of each request
        self.handler_s: list[float] = []  # seconds each request spent in the policy (benchmarks)
        self.disconnects: list[str] = []  # "plain" / "stream": a policy-hang request whose client went away
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)
        self.app.get("/v1/models")(self._models)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="policy-server")

    def start(self) -> "PolicyServer":
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the policy server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    # --- the policy ------------------------------------------------------------------------------------
    async def _chat(self, request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            return await self._answer(request)
        finally:
            self.handler_s.append(time.perf_counter() - t0)

    async def _answer(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        self.auth.append(request.headers.get("authorization"))
        model = body.get("model", "policy")
        if model == "policy-nologprobs":
            for option in ("logprobs", "return_token_ids", "return_tokens_as_token_ids"):
                if body.get(option):
                    return JSONResponse(status_code=400, content={"error": {
                        "message": f"Unsupported parameter: '{option}' is not supported with this model.",
                        "type": "invalid_request_error", "param": option, "code": None}})
        if model == "policy-slow":
            import asyncio

            await asyncio.sleep(1.0)
        if model == "policy-500":
            return JSONResponse(status_code=500, content={"error": {"message": "the policy crashed"}})
        if model == "policy-redirect":
            return JSONResponse(status_code=307, content={}, headers={"location": "http://192.0.2.1/v1/chat"})
        if model == "policy-echo-auth":
            return JSONResponse(status_code=400, content={"error": {
                "message": f"bad request; you sent authorization={request.headers.get('authorization')}"}})
        if model == "policy-hang":
            return await self._hang(request, stream=bool(body.get("stream")))
        messages = body["messages"]
        text_mode = model == "policy-text"
        assistant = self._next(messages, text_mode=text_mode, loop=model in ("policy-loop", "policy-slow"))
        full = self._response(body, messages, assistant)
        if body.get("stream"):
            return StreamingResponse(_sse(full, include_usage=bool((body.get("stream_options") or {})
                                                                   .get("include_usage"))),
                                     media_type="text/event-stream")
        return JSONResponse(full)

    async def _models(self) -> JSONResponse:
        names = ["policy", "policy-text", "policy-loop", "policy-slow", "policy-hang"]
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model", "owned_by": "tests"}
                                                         for n in names]})

    async def _hang(self, request: Request, *, stream: bool):
        import asyncio

        if not stream:
            for _ in range(1200):  # 60 s at most
                if await request.is_disconnected():
                    self.disconnects.append("plain")
                    break
                await asyncio.sleep(0.05)
            return JSONResponse(status_code=504, content={"error": {"message": "hung up"}})

        async def events():
            head = {"id": "chatcmpl-hang", "object": "chat.completion.chunk", "created": 0, "model": "policy-hang",
                    "prompt_token_ids": [2, 3], "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                  "content": "partial"},
                                                             "token_ids": [7], "logprobs": {"content": [
                                                                 {"token": "token_id:7", "logprob": -0.5}]}}]}
            yield "data: " + json.dumps(head) + "\n\n"
            try:
                await asyncio.sleep(60)
            except BaseException:
                self.disconnects.append("stream")
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    def _next(self, messages: list[dict[str, Any]], *, text_mode: bool, loop: bool) -> dict[str, Any]:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        users = sum(1 for m in messages if m["role"] == "user")
        if loop:
            return _tool_call(len(messages), "echo again")
        if text_mode:
            # in text mode the outputs come back as user messages: the instruction is the last user message
            # without "Output of command"
            first = max(i for i, m in enumerate(messages)
                        if m["role"] == "user" and not m["content"].startswith("Output of command"))
            commands = [line[2:] for line in messages[first]["content"].splitlines() if line.startswith("$ ")]
            done = sum(1 for m in messages[first + 1:] if m["role"] == "assistant")
            if done < len(commands):
                return {"role": "assistant", "content": f"Running it.\n```bash\n{commands[done]}\n```\n"}
            out = messages[-1]["content"] if done else ""
            return {"role": "assistant", "content": f"done: {_first_output_line(out)} (users={users})"}
        commands = [line[2:] for line in messages[last_user]["content"].splitlines() if line.startswith("$ ")]
        ran = [m for m in messages[last_user + 1:] if m["role"] == "tool"]
        if len(ran) < len(commands):
            return _tool_call(len(messages), commands[len(ran)])
        out = ran[-1]["content"] if ran else ""
        return {"role": "assistant", "content": f"done: {_first_output_line(out)} (users={users})"}

    def _response(self, body: dict[str, Any], messages: list[dict[str, Any]],
                  assistant: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = render(messages) + [ROLE_IDS["assistant"]]  # the generation prompt
        completion_ids = render_message(assistant)[1:]  # the role id is the template's, not sampled
        seed = body.get("seed")
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": assistant.get("content"),
                                                          "tool_calls": assistant.get("tool_calls", [])},
                                  "finish_reason": "tool_calls" if assistant.get("tool_calls") else "stop"}
        if body.get("logprobs"):
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{tok}" if as_ids else chr(max(tok - 10, 32)),
                 "logprob": logprob(len(prompt_ids) + i, seed), "bytes": None, "top_logprobs": []}
                for i, tok in enumerate(completion_ids)]}
        out: dict[str, Any] = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
                               "created": int(time.time()), "model": body.get("model"), "choices": [choice],
                               "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                                         "total_tokens": len(prompt_ids) + len(completion_ids)}}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = completion_ids
        return out


def _sse(full: dict[str, Any], *, include_usage: bool):
    """The response as vLLM streams it: a first chunk with the role and ``prompt_token_ids``, the text, tool call
    and token ids/logprobs cut into three pieces, a chunk with the finish reason, the usage chunk, ``[DONE]``."""
    choice = full["choices"][0]
    message = choice["message"]
    base = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"], "model": full["model"]}

    def chunk(delta: dict[str, Any], **extra: Any) -> str:
        return "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, **extra}]}) + "\n\n"

    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    if "prompt_token_ids" in full:
        first["prompt_token_ids"] = full["prompt_token_ids"]
    yield "data: " + json.dumps(first) + "\n\n"
    ids = choice.get("token_ids")
    lps = (choice.get("logprobs") or {}).get("content")
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    args = calls[0]["function"]["arguments"] if calls else ""
    for part in range(3):
        def cut(seq):
            n = len(seq)
            return seq[n * part // 3: n * (part + 1) // 3]

        delta: dict[str, Any] = {}
        if text:
            delta["content"] = cut(text)
        if calls:
            fn: dict[str, Any] = {"arguments": cut(args)}
            tc: dict[str, Any] = {"index": 0, "function": fn}
            if part == 0:
                tc.update(id=calls[0]["id"], type="function")
                fn["name"] = calls[0]["function"]["name"]
            delta["tool_calls"] = [tc]
        extra: dict[str, Any] = {}
        if ids is not None:
            extra["token_ids"] = cut(ids)
        if lps is not None:
            extra["logprobs"] = {"content": cut(lps)}
        yield chunk(delta, **extra)
    yield chunk({}, finish_reason=choice["finish_reason"])
    if include_usage:
        yield "data: " + json.dumps({**base, "choices": [], "usage": full["usage"]}) + "\n\n"
    yield "data: [DONE]\n\n"


def _tool_call(n: int, command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function", "function": {"name": "bash",
                                                              "arguments": json.dumps({"command": command})}}]}


def _first_output_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[exit code")
             and not ln.startswith("Output of command")]
    return lines[0].strip() if lines else ""
