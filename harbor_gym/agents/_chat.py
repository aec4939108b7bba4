"""`ChatAgent`: a terminal agent over any OpenAI-compatible Chat Completions endpoint (vLLM, SGLang, OpenAI...),
built on the official ``openai`` client (SPEC GYM-4/5, GYM-13, SES-2/3).

One activation is a loop of model calls. **Tools mode** (default): the request offers one function, ``bash``, whose
required string parameter ``command`` is a bash command; each tool call runs through ``turn.exec`` (in the workdir,
as the turn's agent user) with ``command_timeout_s``, and its exit code and output, cut to ``output_limit_bytes``
(head and tail kept), go back as a ``role: "tool"`` message. Nothing else is added between calls. **Text mode**
(``tool_mode="text"``, for models without tool calling): the model writes commands in fenced blocks opened with
```` ```bash ```` (or ```` ```sh ````); every block of a reply runs in order and their outputs come back in one
``user`` message (`TEXT_PROMPT` says so in the system prompt). Either way the activation ends at the first reply
without a command (its text is the turn's ``response``), or when ``max_steps`` model calls, ``max_turn_tokens``
completion tokens or the turn's time (``turn.time_left_sec``) run out (``metadata["stop_reason"]``; time gives
``status="timeout"``).

Every call is recorded with ``turn.record_model_call`` as it returns (`ModelCall`: the request as a delta, the
response, token ids and logprobs exactly as sent, see `harbor_gym.agents._chat_wire`). Each call's ``seed`` is
derived from ``seed`` (else ``turn.seed``), ``turn.rollout``, the turn and the call (`call_seed`), so a rerun with
the same reset seeds sends the same requests.

A server that cannot be reached (connection refused, timeouts, 5xx, 429, after the client's own ``max_retries``)
ends the activation with ``status="error"``, ``policy="retry"`` and ``failure_kind="harbor_gym:model_unreachable"``
naming the URL (the client retries only while the turn has `_RETRY_TIME_S` or more left; a request cut by the
turn's own time ends the activation as a timeout); 401/403/404 give ``policy="fail"`` and ``harbor_gym:model_error``; any other 400 (e.g. a context
too long) ends the activation as ``completed`` with ``stop_reason="bad_request"``.

Sessions: ``supports_continue = True``. Under ``turn_sessions="continue"`` the conversation (the message list) is
kept in ``turn.session.state["chat_messages"]`` and each later turn appends its instruction to it, so it survives the
pickling of `AsyncVectorEnv` and Ray (the session lives beside the env; a pickled copy of the agent is accepted as
the same agent because `ChatAgent` compares by its settings). Under ``fresh`` each turn starts from the system
prompt and its instruction. The instruction is ``turn.instruction``, so ``prompt_template`` is honoured.

The agent is picklable: the ``openai`` client is made lazily, per process, and never pickled.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Mapping

try:  # the HTTP client the openai SDK itself depends on (named httpx2 in its newer releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases
    import httpx  # type: ignore[no-redef]

from harbor_gym.agents._chat_wire import (
    TOKEN_OPTIONS,
    RefusedOptions,
    call_seed,
    named_options,
    parse_response,
    parse_stream,
)
from harbor_gym.agents._model_calls import ModelCall, message_delta
from harbor_gym.agents._outcome import AgentOutcome, AgentOutcomePolicy, AgentStatus
from harbor_gym.agents._script import tail
from harbor_gym.agents._turn import Turn

__all__ = ["ChatAgent", "BASH_TOOL", "SYSTEM_PROMPT", "TEXT_PROMPT", "MODEL_UNREACHABLE", "MODEL_ERROR",
           "MODEL_BAD_REPLY"]

MODEL_UNREACHABLE = "harbor_gym:model_unreachable"
MODEL_ERROR = "harbor_gym:model_error"
#: The server's answer broke the protocol: not JSON, the wrong shapes, over ``max_reply_bytes``, or a (streamed)
#: answer still arriving when its time ran out. Ungraded and retryable, like an unreachable server.
MODEL_BAD_REPLY = "harbor_gym:model_bad_reply"

#: The tool of tools mode: ``bash`` with one required string parameter, ``command``.
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's sandbox (in the working folder) and get its exit code and "
                       "output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the bash command to run"}},
            "required": ["command"],
        },
    },
}

SYSTEM_PROMPT = ("You are an agent working in a Linux sandbox. Use the bash tool to inspect and change files and "
                 "run commands until the task is done; then reply with a short summary and no tool call.")

TEXT_PROMPT = ("To run a command, write it in a fenced code block that starts with ```bash and ends with ```. "
               "Every such block in your reply runs in order, and their outputs come back in the next message. "
               "When the task is done, reply without a bash block.")

_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\n(.*?)```", re.DOTALL)
_CONTINUE_KEY = "chat_messages"
#: Below this many seconds left of the turn, a request gets no client retries (one try, bounded by the time left).
_RETRY_TIME_S = 10.0


def _truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    half = max(limit // 2, 1)
    head = data[:half].decode("utf-8", "ignore")
    rest = data[-half:].decode("utf-8", "ignore")
    return f"{head}\n[... harbor_gym: output cut: {len(data) - 2 * half} of {len(data)} bytes left out ...]\n{rest}"


class ChatAgent:
    """A bash agent over an OpenAI-compatible Chat Completions endpoint (see the module docstring).

    Args:
        model: the model name the server serves.
        base_url: the endpoint, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: the key; ``None``: the variable ``api_key_env`` (default ``OPENAI_API_KEY``), else ``"EMPTY"``
            (local servers need none). Never shown by ``repr``; a key given here travels with the pickled agent
            to vector-env workers and Ray actors, a key in ``api_key_env`` is read in the process that calls.
        max_steps: model calls per activation (default 30).
        temperature: sampling temperature (default 1.0, on-policy sampling for RL).
        max_tokens: completion tokens per call (default 4096).
        seed: base of the per-call seeds (``None``: ``turn.seed``; both ``None``: no seed is sent).
        system_prompt: the system message (default `SYSTEM_PROMPT`; text mode appends `TEXT_PROMPT`).
        tool_mode: ``"tools"`` (default) or ``"text"``.
        command_timeout_s: bound of one command (default 120 s; the turn's time left bounds it too).
        output_limit_bytes: the most of a command's output sent back (default 16384 bytes, head and tail).
        max_turn_tokens: completion tokens per activation (``None``: no bound).
        request_timeout_s: bound of one HTTP request (default 600 s; the turn's time left bounds it too).
        max_retries: the ``openai`` client's own retries of a failed request (default 2).
        token_data: ask for token ids and logprobs (default True).
        extra_body: more request-body fields (e.g. ``{"top_k": 20}``).
        stream: ask for a streamed answer (``stream_options.include_usage``) and join its chunks, token ids and
            logprobs included (`parse_stream`); default False.
        max_reply_bytes: the most bytes of one answer read (default 32 MiB); a longer answer ends the activation
            with `MODEL_BAD_REPLY`.
        max_tool_calls_per_reply: the most commands of one reply that run (default 64); each one past it gets an
            error message as its output and does not run.

    Whatever the server answers (malformed JSON, wrong shapes, huge or endless answers, thousands of tool calls),
    the activation ends within the turn's time with a documented ``failure_kind`` or stop reason, and what the
    sandbox printed only ever reaches the conversation as the content string of a ``tool`` (or, in text mode,
    ``user``) message: never as a role, a tool call or a command of the model.
    """

    name = "chat"
    version = "1"
    supports_continue = True

    def __init__(self, model: str, base_url: str, api_key: str | None = None, *, max_steps: int = 30,
                 temperature: float = 1.0, max_tokens: int = 4096, seed: int | None = None,
                 system_prompt: str | None = None, tool_mode: str = "tools", command_timeout_s: float = 120.0,
                 output_limit_bytes: int = 16384, max_turn_tokens: int | None = None,
                 request_timeout_s: float = 600.0, max_retries: int = 2, token_data: bool = True,
                 extra_body: Mapping[str, Any] | None = None, api_key_env: str = "OPENAI_API_KEY",
                 stream: bool = False, max_reply_bytes: int = 32 * 1024 * 1024,
                 max_tool_calls_per_reply: int = 64) -> None:
        if tool_mode not in ("tools", "text"):
            raise ValueError(f"ChatAgent: tool_mode must be 'tools' or 'text', got {tool_mode!r}")
        if max_steps < 1:
            raise ValueError("ChatAgent: max_steps must be >= 1")
        if max_reply_bytes < 1 or max_tool_calls_per_reply < 1:
            raise ValueError("ChatAgent: max_reply_bytes and max_tool_calls_per_reply must be >= 1")
        self.model = str(model)
        self.base_url = str(base_url).rstrip("/")
        self._api_key = api_key
        self.api_key_env = api_key_env
        self.max_steps = int(max_steps)
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.seed = None if seed is None else int(seed)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else str(system_prompt)
        self.tool_mode = tool_mode
        self.command_timeout_s = float(command_timeout_s)
        self.output_limit_bytes = int(output_limit_bytes)
        self.max_turn_tokens = None if max_turn_tokens is None else int(max_turn_tokens)
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.token_data = bool(token_data)
        self.extra_body = dict(extra_body or {})
        self.stream = bool(stream)
        self.max_reply_bytes = int(max_reply_bytes)
        self.max_tool_calls_per_reply = int(max_tool_calls_per_reply)
        self._client_obj: Any = None

    # --- identity, pickling --------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The ATIF ``agent.model_name`` (VER-10)."""
        return self.model

    def _settings(self) -> tuple:
        return (self.model, self.base_url, self.api_key_env, self.max_steps, self.temperature, self.max_tokens,
                self.seed, self.system_prompt, self.tool_mode, self.command_timeout_s, self.output_limit_bytes,
                self.max_turn_tokens, self.request_timeout_s, self.max_retries, self.token_data,
                json.dumps(self.extra_body, sort_keys=True, default=str), self.stream, self.max_reply_bytes,
                self.max_tool_calls_per_reply)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._settings() == self._settings()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._settings())

    def __repr__(self) -> str:
        return f"ChatAgent(model={self.model!r}, base_url={self.base_url!r}, tool_mode={self.tool_mode!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client_obj"] = None  # made again, lazily, in the receiving process
        return state

    def _client(self) -> Any:
        if self._client_obj is None:
            import openai

            key = self._api_key or os.environ.get(self.api_key_env) or "EMPTY"
            self._client_obj = openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=self.max_retries,
                                             timeout=self.request_timeout_s)
        return self._client_obj

    # --- one activation ----------------------------------------------------------------------------------
    def run(self, turn: Turn) -> AgentOutcome:
        """One activation (see the module docstring)."""
        session = turn.session
        continued = getattr(session, "mode", None) == "continue" and isinstance(getattr(session, "state", None), dict)
        history = list(session.state.get(_CONTINUE_KEY, ())) if continued else []
        if not history:
            system = self.system_prompt + ("\n\n" + TEXT_PROMPT if self.tool_mode == "text" else "")
            history = [{"role": "system", "content": system}]
        messages = history + [{"role": "user", "content": turn.instruction}]
        try:
            return self._loop(turn, messages)
        finally:
            if continued:
                session.state[_CONTINUE_KEY] = messages

    def _loop(self, turn: Turn, messages: list[dict[str, Any]]) -> AgentOutcome:
        steps: list[dict[str, Any]] = []
        previous: list[dict[str, Any]] | None = None
        tokens_used, last_exit, last_output = 0, None, ""
        stop, status, response = "max_steps", AgentStatus.COMPLETED, None
        for call_index in range(self.max_steps):
            left = turn.time_left_sec
            if turn.is_expired or (left is not None and left < 0.5):
                stop, status = "time", AgentStatus.TIMEOUT
                break
            if self.max_turn_tokens is not None and tokens_used >= self.max_turn_tokens:
                stop = "max_turn_tokens"
                break
            max_tokens = self.max_tokens if self.max_turn_tokens is None else min(
                self.max_tokens, self.max_turn_tokens - tokens_used)
            seed = call_seed(self.seed if self.seed is not None else turn.seed, turn.rollout, turn.index, call_index)
            try:
                call, parsed = self._call(messages, previous, seed=seed, max_tokens=max_tokens, time_left=left)
            except _ModelFailure as failure:
                left = turn.time_left_sec
                if turn.is_expired or (left is not None and left < 0.5):  # the request was cut by the turn's time
                    stop, status = "time", AgentStatus.TIMEOUT
                    break
                return AgentOutcome(status=AgentStatus.ERROR, policy=failure.policy, failure_kind=failure.kind,
                                    output_tail=failure.message, trajectory=tuple(steps),
                                    metadata={"stop_reason": "model_failure", "base_url": self.base_url,
                                              "model": self.model, "calls": call_index})
            except _BadRequest as bad:
                stop, last_output = "bad_request", bad.message
                break
            turn.record_model_call(call)
            previous = [dict(m) for m in messages]
            tokens_used += _completion_tokens(parsed)
            assistant = {"role": "assistant", "content": parsed.text}
            if self.tool_mode == "tools" and parsed.tool_calls:
                assistant["tool_calls"] = [{"id": c["id"], "type": "function",
                                            "function": {"name": c["name"], "arguments": c["arguments"]}}
                                           for c in parsed.tool_calls]
            messages.append(assistant)
            step = {"source": "agent", "message": parsed.text or "", "model_name": self.model,
                    "metrics": {k: v for k, v in (parsed.usage or {}).items() if isinstance(v, (int, float))}}
            commands = self._commands(parsed)
            if not commands:
                response, stop = parsed.text, "answer"
                steps.append(step)
                break
            results, text_outputs = [], []
            for call_id, command, error in commands:
                if error is None and turn.is_expired:
                    error = "error: not run: the turn's time ran out"
                    stop, status = "time", AgentStatus.TIMEOUT
                if error is not None:
                    output = error
                else:
                    last_exit, output = self._run_command(turn, command)
                    last_output = output
                results.append({"source_call_id": call_id, "content": output} if call_id else {"content": output})
                if self.tool_mode == "tools":
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
                else:
                    text_outputs.append(f"Output of command {len(text_outputs) + 1}:\n{output}")
            if self.tool_mode == "text":
                messages.append({"role": "user", "content": "\n\n".join(text_outputs)})
            else:
                step["tool_calls"] = [{"tool_call_id": c["id"], "function_name": c["name"] or "",
                                       "arguments": _arguments(c["arguments"])} for c in parsed.tool_calls]
            step["observation"] = {"results": results}
            steps.append(step)
            if status is AgentStatus.TIMEOUT:
                break
        return AgentOutcome(status=status, response=response, exit_code=last_exit, trajectory=tuple(steps),
                            output_tail=tail(last_output or (response or "")),
                            metadata={"stop_reason": stop, "calls": len(turn.model_calls), "model": self.model,
                                      "base_url": self.base_url, "completion_tokens": tokens_used})

    # --- commands ----------------------------------------------------------------------------------------
    def _commands(self, parsed: Any) -> list[tuple[str | None, str, str | None]]:
        """``(tool_call_id, command, error)`` of each command of a reply; ``error`` is sent back instead of running
        (a tool that is not ``bash``, arguments that are not JSON with a string ``command``)."""
        if self.tool_mode == "text":
            blocks = _BLOCK.findall(parsed.text or "")
            return [(None, block, None) if i < self.max_tool_calls_per_reply else
                    (None, "", f"error: not run: a reply may run at most {self.max_tool_calls_per_reply} commands")
                    for i, block in enumerate(blocks)]
        out = []
        for c in parsed.tool_calls:
            if len(out) >= self.max_tool_calls_per_reply:
                out.append((c["id"], "", f"error: not run: a reply may run at most {self.max_tool_calls_per_reply} "
                                         "commands"))
                continue
            if c["name"] != "bash":
                out.append((c["id"], "", f"error: no tool named {c['name']!r}; the only tool is bash"))
                continue
            args = _arguments(c["arguments"])
            command = args.get("command") if isinstance(args, dict) else None
            if not isinstance(command, str):
                out.append((c["id"], "", "error: the arguments must be JSON with a string 'command'"))
            else:
                out.append((c["id"], command, None))
        return out

    def _run_command(self, turn: Turn, command: str) -> tuple[int | None, str]:
        result = turn.exec(command, timeout=self.command_timeout_s)
        text = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr
                                if result.stderr else "")
        if result.timed_out:
            head = f"[command timed out after {self.command_timeout_s:g} s or the turn's time ran out]\n"
            return None, _truncate(head + text, self.output_limit_bytes)
        return result.exit_code, _truncate(f"[exit code {result.exit_code}]\n{text}", self.output_limit_bytes)

    # --- one model call ----------------------------------------------------------------------------------
    def _call(self, messages: list[dict[str, Any]], previous: list[dict[str, Any]] | None, *, seed: int | None,
              max_tokens: int, time_left: float | None) -> tuple[ModelCall, Any]:
        import openai

        sent_options = {} if not self.token_data else {
            k: v for k, v in TOKEN_OPTIONS.items() if k not in RefusedOptions.get(self.base_url)}
        timeout = self.request_timeout_s if time_left is None else max(0.5, min(self.request_timeout_s, time_left))
        # the client's own retries only while the turn has time for them; near its end one try, bounded by it
        retries = self.max_retries if time_left is None or time_left >= _RETRY_TIME_S else 0
        t0 = time.monotonic()
        for _ in range(len(TOKEN_OPTIONS) + 1):
            params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": max_tokens}
            if seed is not None:
                params["seed"] = seed
            if self.tool_mode == "tools":
                params["tools"] = [BASH_TOOL]
            body = {**self.extra_body, **{k: v for k, v in sent_options.items() if k != "logprobs"}}
            if "logprobs" in sent_options:
                params["logprobs"] = True
            if self.stream:
                params["stream"] = True
                params["stream_options"] = {"include_usage": True}
            try:
                parsed = self._send(timeout, retries, messages, body, params)
                break
            except openai.BadRequestError as exc:
                refused = named_options(str(exc), set(sent_options))
                if not refused:
                    raise _BadRequest(f"the model server refused the request (400): {_one_line(exc)}") from exc
                RefusedOptions.add(self.base_url, refused)
                sent_options = {k: v for k, v in sent_options.items() if k not in refused}
            except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
                raise _ModelFailure(MODEL_ERROR, AgentOutcomePolicy.FAIL,
                                    f"model server {self.base_url} refused: {_one_line(exc)}") from exc
            except (openai.APIConnectionError, openai.APIStatusError) as exc:
                raise _ModelFailure(MODEL_UNREACHABLE, AgentOutcomePolicy.RETRY,
                                    f"model server {self.base_url} unreachable after {self.max_retries} retries: "
                                    f"{type(exc).__name__}: {_one_line(exc)}") from exc
            except _BadReply as exc:
                raise _ModelFailure(MODEL_BAD_REPLY, AgentOutcomePolicy.RETRY,
                                    f"model server {self.base_url} gave an unusable answer: {exc}") from exc
        else:
            raise _BadRequest("the model server refused every form of the request (400)")
        latency = time.monotonic() - t0
        params.pop("stream", None)
        params.pop("stream_options", None)
        if self.stream:
            params["stream"] = True
        offset, delta = message_delta(previous, messages)
        request_params = {k: v for k, v in params.items() if k != "seed"}
        if body:
            request_params["extra_body"] = body
        call = ModelCall(request_messages=delta, messages_offset=offset, response_text=parsed.text,
                         tool_calls=parsed.tool_calls, finish_reason=parsed.finish_reason, usage=parsed.usage,
                         latency_s=latency, prompt_token_ids=parsed.prompt_token_ids,
                         completion_token_ids=parsed.completion_token_ids, logprobs=parsed.logprobs, seed=seed,
                         model=self.model, params=request_params)
        return call, parsed


    def _send(self, timeout: float, retries: int, messages: list[dict[str, Any]], body: dict[str, Any],
              params: dict[str, Any]) -> Any:
        """One HTTP request; the answer as sent (raw JSON, or the raw SSE chunks when streaming), parsed.

        The body is read piece by piece against ``timeout`` as a whole (not per read: a server trickling bytes
        never holds the turn past it) and against ``max_reply_bytes``.

        Raises:
            _BadReply: the answer is unusable (see `MODEL_BAD_REPLY`).
        """
        completions = self._client().with_options(timeout=timeout, max_retries=retries).chat.completions
        deadline = time.monotonic() + timeout
        with completions.with_streaming_response.create(model=self.model, messages=messages,
                                                        extra_body=body or None, **params) as response:
            try:
                raw = self._read_reply(response.iter_bytes(), deadline)
            except httpx.HTTPError as exc:
                raise _BadReply(f"the answer broke off ({type(exc).__name__})") from exc
        try:
            if not self.stream:
                return parse_response(_json_object(raw))
            chunks = []
            for line in raw.splitlines():
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:"):].strip()
                if data == b"[DONE]":
                    break
                chunks.append(_json_object(data))
            return parse_stream(chunks)
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            raise _BadReply(f"{type(exc).__name__}: {_one_line(exc)}") from exc

    def _read_reply(self, pieces: Any, deadline: float) -> bytes:
        out = bytearray()
        for piece in pieces:
            out += piece
            if len(out) > self.max_reply_bytes:
                raise _BadReply(f"the answer is over max_reply_bytes ({self.max_reply_bytes} bytes)")
            if time.monotonic() > deadline:
                raise _BadReply("the answer was still arriving when its time ran out")
            if self.stream and out.rstrip().endswith(b"data: [DONE]"):
                break
        return bytes(out)


class _ModelFailure(Exception):
    def __init__(self, kind: str, policy: AgentOutcomePolicy, message: str) -> None:
        super().__init__(message)
        self.kind, self.policy, self.message = kind, policy, message


class _BadReply(Exception):
    """The server's answer is unusable (`MODEL_BAD_REPLY`)."""


class _BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _json_object(raw: bytes) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("the answer is not a JSON object")
    return value


def _arguments(raw: str) -> Any:
    try:
        value = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def _completion_tokens(parsed: Any) -> int:
    usage = parsed.usage or {}
    if isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    return len(parsed.completion_token_ids or ())
