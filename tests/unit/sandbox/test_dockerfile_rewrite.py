"""images: FROM rewriting through the alias table (flags, stages, ARGs), alias lookup with ':latest', and the
content hash of a build context (stable, sensitive to content and .dockerignore). No Docker needed."""

from __future__ import annotations

from harbor_gym.sandbox.images import _context_tar, alias_of, rewrite_from_lines

ALIASES = {"debian:bookworm-slim": "harbor-gym/base:bookworm", "busybox:latest": "local/busybox:1"}


def test_alias_of_exact_and_latest():
    assert alias_of("debian:bookworm-slim", ALIASES) == "harbor-gym/base:bookworm"
    assert alias_of("busybox", ALIASES) == "local/busybox:1"
    assert alias_of("debian:12", ALIASES) == "debian:12"


def test_from_lines_are_rewritten_keeping_flags_and_stages():
    text = (
        "ARG BASE=debian:bookworm-slim\n"
        "FROM --platform=linux/amd64 debian:bookworm-slim AS build\n"
        "RUN echo hi\n"
        "from build as second\n"
        "FROM $BASE\n"
        "FROM busybox\n"
        "FROM scratch\n"
    )
    out, bases = rewrite_from_lines(text, ALIASES)
    assert out.splitlines() == [
        "ARG BASE=debian:bookworm-slim",
        "FROM --platform=linux/amd64 harbor-gym/base:bookworm AS build",
        "RUN echo hi",
        "from build as second",
        "FROM $BASE",
        "FROM local/busybox:1",
        "FROM scratch",
    ]
    assert bases == ["harbor-gym/base:bookworm", "local/busybox:1"]


def test_context_hash_follows_content_not_mtime(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY a.txt /a.txt\n")
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / ".dockerignore").write_text("ignored.txt\n")
    (tmp_path / "ignored.txt").write_text("x")
    _, h1, bases = _context_tar(tmp_path, "Dockerfile", ALIASES)
    assert bases == ["harbor-gym/base:bookworm"]
    (tmp_path / "ignored.txt").write_text("changed")  # ignored: same hash
    import os
    os.utime(tmp_path / "a.txt", (1, 1))  # mtime only: same hash
    assert _context_tar(tmp_path, "Dockerfile", ALIASES)[1] == h1
    (tmp_path / "a.txt").write_text("two")
    assert _context_tar(tmp_path, "Dockerfile", ALIASES)[1] != h1
    assert _context_tar(tmp_path, "Dockerfile", {})[1] != _context_tar(tmp_path, "Dockerfile", ALIASES)[1]
