"""BuildKit's pure parts (Issue 16 item 2): which Dockerfiles need it, the ``# syntax=`` directive, heredocs, the
engine's ping headers, and BuildKit's protobuf progress messages. No Docker."""

from __future__ import annotations

import base64

from harbor_gym.sandbox._buildkit import (
    TraceDigest,
    decode_trace,
    drop_syntax_line,
    engine_buildkit,
    scan_dockerfile,
)


def test_run_mount_and_copy_chmod_need_buildkit():
    text = "FROM debian:bookworm-slim\nRUN apt-get update\nRUN --mount=type=cache,target=/root/.cache \\\n  pip install x\n"
    assert scan_dockerfile(text).needs == "line 3: RUN --mount"
    assert scan_dockerfile("FROM a\nCOPY --chmod=0755 x /x\n").needs == "line 2: COPY --chmod"
    assert scan_dockerfile("FROM a\nCOPY --chown=1:1 x /x\nRUN echo --mount\n").needs is None
    assert scan_dockerfile("FROM a\n# RUN --mount=type=cache,target=/x true\nRUN true\n").needs is None


def test_syntax_directive_only_at_the_top_and_dropped_in_place():
    text = "# syntax=docker/dockerfile:1.4\n# escape=\\\nFROM a\nRUN true\n"
    scan = scan_dockerfile(text)
    assert scan.syntax == ("docker/dockerfile:1.4", 1) and scan.needs is None
    assert drop_syntax_line(text, 1) == "\n# escape=\\\nFROM a\nRUN true\n"
    assert scan_dockerfile("FROM a\n# syntax=docker/dockerfile:1.4\n").syntax is None


def test_heredoc_found_but_not_here_strings():
    scan = scan_dockerfile("FROM a\nRUN <<EOF\necho hi\nEOF\n")
    assert scan.heredoc_line == 2 and scan.needs == "line 2: a heredoc"
    assert scan_dockerfile("FROM a\nCOPY <<'END' /x\nhi\nEND\n").heredoc_line == 2
    assert scan_dockerfile('FROM a\nRUN cat <<< "x" > /y\n').heredoc_line is None


def test_engine_buildkit_from_ping_headers():
    docker_20 = {"Api-Version": "1.41", "Ostype": "linux", "Server": "Docker/20.10.24+dfsg1 (linux)"}
    assert engine_buildkit(docker_20) == (True, 20)
    assert engine_buildkit({**docker_20, "Api-Version": "1.38"})[0] is False
    assert engine_buildkit({**docker_20, "Libpod-Api-Version": "4.3.1"})[0] is False
    assert engine_buildkit({**docker_20, "Ostype": "windows"})[0] is False


def _field(number: int, payload: bytes) -> bytes:
    size = len(payload)
    varint = b""
    while True:
        byte = size & 0x7F
        size >>= 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([(number << 3) | 2]) + varint + payload


def test_decode_trace_reads_vertex_names_errors_and_logs():
    vertex = _field(1, b"sha256:abc") + _field(3, b"[2/2] RUN false") + _field(7, b"exit code: 1")
    log = _field(1, b"sha256:abc") + bytes([3 << 3, 2]) + _field(4, b"boom\nsecond line\n")
    message = base64.b64encode(_field(1, vertex) + _field(3, log)).decode()
    digest = TraceDigest()
    decode_trace(message, digest)
    assert digest.lines == ["#1 [2/2] RUN false", "boom", "second line"]
    assert digest.errors == ["[2/2] RUN false: exit code: 1"]
    decode_trace("not base64 protobuf!!", digest)  # ignored
