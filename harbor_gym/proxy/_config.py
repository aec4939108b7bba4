"""What the capture proxy forwards to (`ModelUpstream`) and the caps it holds model traffic to (`ProxyLimits`,
SPEC GYM-10: model traffic from a sandbox is data, capped in real bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ModelUpstream", "ProxyLimits", "RESERVED_BODY_FIELDS"]

#: Request fields the proxy owns: ``extra_body`` may not force them.
RESERVED_BODY_FIELDS = frozenset({"messages", "stream", "stream_options", "n"})

MiB = 1024 * 1024


class ModelUpstream(BaseModel):
    """The OpenAI-compatible server the capture proxy forwards every model call to (what
    ``EnvConfig.model_upstream`` holds). Frozen; holds the *name* of the variable with the key, never the key.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="The upstream's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
                                      "(http or https; no user, password, query or fragment).")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="The NAME of the host environment variable "
                                    "holding the upstream's API key, read when a call is forwarded; None, or a "
                                    "variable that is unset or empty: no Authorization header is sent.")
    model: str | None = Field(None, description="Force this model name on every request (None: the harness's).")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Other request fields forced on every "
                                       "request (they override the harness's); not messages, stream, "
                                       "stream_options or n.")
    timeout_s: float = Field(600.0, gt=0, description="Bound of one upstream call in seconds (connect, and "
                             "between bytes of the answer).")

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("base_url must not carry a user or password (put the key in the variable named by "
                             "api_key_env)")
        if parts.query or parts.fragment:
            raise ValueError("base_url must not carry a query or fragment (a key there would reach records)")
        return value.strip().rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or not value.replace("_", "a").isalnum() or value[0].isdigit()):
            raise ValueError(f"api_key_env must be an environment variable NAME (letters, digits, _), got "
                             f"{value!r}")
        return value

    @field_validator("extra_body")
    @classmethod
    def _check_extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(RESERVED_BODY_FIELDS & set(value))
        if reserved:
            raise ValueError(f"extra_body must not force {reserved}: the proxy owns them")
        return value


@dataclass(frozen=True)
class ProxyLimits:
    """GYM-10 caps of the capture proxy, in real bytes and seconds. Over a cap, the caller gets a clear HTTP error
    and the call is recorded (or counted, where recording it would itself be unbounded).

    Attributes:
        max_request_bytes: one request body (413 over it).
        max_response_bytes: one upstream answer, streamed or not (the call ends ``error``, 502).
        max_activation_bytes: request and answer bytes of every call of one activation window together.
        max_calls_per_activation: calls admitted per activation window (429 past it, counted, not recorded).
        max_connections_per_peer: open connections from one peer address (503 and closed past it, counted).
        max_concurrent_calls_per_session: model calls of one session (one episode) in flight at once; one more
            is answered 429 and counted in the window's ``refused_over_cap``, so that one episode cannot hold
            the upstream's capacity that other episodes share.
        max_header_bytes: the request line and headers of one request (431 over it).
        header_timeout_s: the request line and headers must arrive within this (slowloris; 408).
        request_timeout_s: a whole request (headers and body) must arrive within this (408).
        idle_timeout_s: a kept-alive connection idle this long is closed; a read or write stalled this long
            fails.
    """

    max_request_bytes: int = 16 * MiB
    max_response_bytes: int = 16 * MiB
    max_activation_bytes: int = 512 * MiB
    max_calls_per_activation: int = 4096
    max_connections_per_peer: int = 256
    max_concurrent_calls_per_session: int = 16
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 30.0
    request_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ProxyLimits.{f.name} must be a positive number, got {value!r} (GYM-10)")
