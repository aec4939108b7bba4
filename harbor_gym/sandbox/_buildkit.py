"""BuildKit builds for Dockerfiles that need them (``RUN --mount=...``), through the engine's own API.

Why not the ``docker`` CLI with ``DOCKER_BUILDKIT=1``: current CLIs hand BuildKit builds to the ``buildx`` plugin,
which a Debian Docker 20.10 host does not have, while every Linux engine since API 1.39 runs BuildKit itself. So the
build is the same ``POST /build`` the SDK sends for classic builds, with ``version=2`` (the engine's BuildKit) and
the context as a GNU tar body (BuildKit does not take a PAX header as an archive). harbor_gym stays on the SDK: no
CLI, no buildx, no network (the base images come from the alias table and the engine's local store).

Pure parts (unit-tested without an engine): `scan_dockerfile` says whether a Dockerfile needs BuildKit and why,
finds the ``# syntax=`` directive and heredocs; `decode_trace` reads BuildKit's progress messages (protobuf
``StatusResponse``) into log lines and vertex errors; `engine_buildkit` reads the engine's ping headers.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["DockerfileScan", "scan_dockerfile", "drop_syntax_line", "decode_trace", "engine_buildkit",
           "buildkit_build"]

_DIRECTIVE = re.compile(r"^\s*#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")
_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$")
_BUILDKIT_FLAGS = {
    "RUN": ("--mount", "--network", "--security"),
    "COPY": ("--chmod", "--link", "--parents", "--exclude"),
    "ADD": ("--chmod", "--link", "--checksum", "--keep-git-dir", "--exclude"),
}
_HEREDOC = re.compile(r"(?<!<)<<-?\s*([\"']?)[A-Za-z_][A-Za-z0-9_]*\1(?!<)")


@dataclass(frozen=True)
class DockerfileScan:
    """What a Dockerfile asks of the builder.

    Attributes:
        needs: why it needs BuildKit (``"line 3: RUN --mount"``), or ``None``.
        syntax: the ``# syntax=`` frontend image and its line number (1-based), or ``None``.
        heredoc_line: the first line using a heredoc (``RUN <<EOF``), or ``None``.
    """

    needs: str | None = None
    syntax: tuple[str, int] | None = None
    heredoc_line: int | None = None


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, instruction text with ``\\`` continuations joined); comments dropped."""
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not buf:
            start = number
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        yield start, " ".join(buf)
        buf = []
    if buf:
        yield start, " ".join(buf)


def scan_dockerfile(text: str) -> DockerfileScan:
    """Scan ``text`` (pure). BuildKit is needed by ``RUN --mount|--network|--security``, ``COPY``/``ADD`` flags the
    classic builder lacks (``--chmod``, ``--link``, ...), and a heredoc; a ``# syntax=`` directive counts only
    among the leading directive lines."""
    syntax = None
    for number, raw in enumerate(text.splitlines(), 1):
        m = _DIRECTIVE.match(raw)
        if m is None:
            break
        if m.group(1).lower() == "syntax":
            syntax = (m.group(2), number)
    needs = None
    heredoc = None
    for number, line in _logical_lines(text):
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        word, rest = m.group(1).upper(), m.group(2)
        if word in ("RUN", "COPY", "ADD") and heredoc is None and _HEREDOC.search(rest):
            heredoc = number
        for flag in _BUILDKIT_FLAGS.get(word, ()):
            if re.search(rf"(^|\s){re.escape(flag)}(=|\s)", rest) and needs is None:
                needs = f"line {number}: {word} {flag}"
    if needs is None and heredoc is not None:
        needs = f"line {heredoc}: a heredoc"
    return DockerfileScan(needs=needs, syntax=syntax, heredoc_line=heredoc)


def drop_syntax_line(text: str, line: int) -> str:
    """``text`` with line ``line`` (1-based, the ``# syntax=`` directive) blanked, keeping line numbers."""
    lines = text.splitlines(keepends=True)
    ending = "\n" if lines[line - 1].endswith("\n") else ""
    lines[line - 1] = ending
    return "".join(lines)


def engine_buildkit(headers: Mapping[str, str]) -> tuple[bool, int]:
    """From the engine's ``/_ping`` headers: (whether its API runs BuildKit builds, its major version or 0).

    A Linux Docker engine with API >= 1.39 does; Podman's compatible API (``Libpod-Api-Version``) does not."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "libpod-api-version" in lowered or lowered.get("ostype", "linux").lower() != "linux":
        return False, 0
    try:
        major, minor = (int(p) for p in lowered.get("api-version", "0.0").split(".")[:2])
    except ValueError:
        return False, 0
    server = re.search(r"Docker/(\d+)\.", lowered.get("server", ""))
    return (major, minor) >= (1, 39), int(server.group(1)) if server else 0


# --- BuildKit progress: a minimal protobuf reader for moby.buildkit.v1.StatusResponse ---------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            return
        yield number, value


@dataclass
class TraceDigest:
    """Log lines and vertex errors gathered from BuildKit's progress messages."""

    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)


def decode_trace(aux_b64: str, into: TraceDigest) -> None:
    """Add one ``moby.buildkit.trace`` message (base64 protobuf ``StatusResponse``) to ``into``: each vertex's name
    and error (field 1), each log chunk (field 3) split into lines. Malformed input is ignored."""
    try:
        data = base64.b64decode(aux_b64)
        for number, value in _fields(data):
            if number == 1 and isinstance(value, bytes):
                vertex = dict((n, v) for n, v in _fields(value) if isinstance(v, bytes))
                digest = vertex.get(1, b"").decode("utf-8", "replace")
                name = vertex.get(3, b"").decode("utf-8", "replace")
                if name and digest not in into.names:
                    into.names[digest] = name
                    into.lines.append(f"#{len(into.names)} {name}")
                error = vertex.get(7, b"").decode("utf-8", "replace")
                if error:
                    into.errors.append(f"{name}: {error}" if name else error)
            elif number == 3 and isinstance(value, bytes):
                log = dict((n, v) for n, v in _fields(value) if isinstance(v, bytes))
                into.lines.extend(log.get(4, b"").decode("utf-8", "replace").splitlines())
    except (ValueError, IndexError):
        return


def buildkit_build(client: Any, data: bytes, *, tag: str, dockerfile: str, labels: Mapping[str, str],
                   timeout_s: float, deadline: float, now: Any, lines: list[str], network: bool = False) -> str | None:
    """Run one BuildKit build of the context tar ``data`` (GNU format); returns the build's error or ``None``, its
    log lines (vertex names and output) appended to ``lines``. Without ``network`` the build's steps run with no
    network (``networkmode=none``).

    Raises:
        requests exceptions and `docker.errors.DockerException` as the SDK raises them (the caller translates);
        TimeoutError: ``now() > deadline`` while the build streams.
    """
    api = client.api
    params = {"t": tag, "dockerfile": dockerfile, "version": "2", "rm": "1", "forcerm": "1",
              "labels": json.dumps(dict(labels))}
    if not network:  # RUN steps get no network at all; nothing here ever grants network.host
        params["networkmode"] = "none"
    response = api._post(api._url("/build"), params=params, data=data,
                         headers={"Content-Type": "application/x-tar"}, stream=True, timeout=max(1, int(timeout_s)))
    api._raise_for_status(response)
    digest = TraceDigest(lines=lines)
    error = None
    for chunk in _json_stream(response.iter_lines()):
        if chunk.get("id") == "moby.buildkit.trace" and isinstance(chunk.get("aux"), str):
            decode_trace(chunk["aux"], digest)
        elif "stream" in chunk:
            digest.lines.extend(str(chunk["stream"]).rstrip("\n").splitlines())
        if "error" in chunk:
            error = str(chunk["error"])
        if now() > deadline:
            response.close()
            raise TimeoutError("build deadline")
    if error is not None and digest.errors and digest.errors[-1] not in error:
        error = f"{error} ({digest.errors[-1]})"
    return error


def _json_stream(lines: Iterable[bytes]) -> Iterator[dict]:
    for line in lines:
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
