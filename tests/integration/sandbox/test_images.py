"""Docker images: builds through the alias table (offline FROM), a content-addressed labelled cache reused while
unchanged, .dockerignore honoured, failures with the log's end, concurrent builds, and the pull policy."""

from __future__ import annotations

import threading
import time

import pytest

from harbor_gym.errors import ImageError
from harbor_gym.sandbox import DockerSandbox, SandboxSpec, count_requests
from harbor_gym.sandbox.images import BUILD_REPO, CACHE_LABEL, build_image, resolve_image

pytestmark = pytest.mark.docker


def _context(tmp_path, marker: str):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM debian:bookworm-slim AS base\nCOPY hello.txt /hello.txt\nFROM base\nWORKDIR /srv\n"
        f"RUN echo {marker} > /marker\n"
    )
    (ctx / "hello.txt").write_text("hello\n")
    (ctx / ".dockerignore").write_text("secret.txt\n")
    (ctx / "secret.txt").write_text("nope")
    return ctx


def test_build_offline_through_aliases_cached_and_reused(tmp_path, settings_with, docker_client):
    settings = settings_with()
    ctx = _context(tmp_path, f"m{time.time_ns()}")
    first = build_image(docker_client, ctx, settings, timeout_s=120)
    assert first.ref.startswith(f"{BUILD_REPO}:") and first.workdir == "/srv"
    labels = docker_client.api.inspect_image(first.ref)["Config"]["Labels"]
    assert labels["io.harbor-gym.managed"] == "true" and labels[CACHE_LABEL] == "build"
    counter = count_requests(docker_client)
    again = build_image(docker_client, ctx, settings, timeout_s=120)
    assert again == first and not any("/build" in p for p in counter.paths)  # reused, no build request
    spec = SandboxSpec(build_context=ctx, name_hint="built")
    with DockerSandbox(spec, settings) as sb:
        assert sb.workdir == "/srv"
        r = sb.exec("cat /hello.txt; test -e /secret.txt || echo ignored", timeout=10)
        assert r.stdout == "hello\nignored\n"
    docker_client.api.remove_image(first.ref)


def test_concurrent_builds_of_one_context_share_one_image(tmp_path, settings_with, docker_client):
    ctx = _context(tmp_path, f"c{time.time_ns()}")
    results, errors = [], []

    def build():
        try:
            results.append(build_image(docker_client, ctx, settings_with(), timeout_s=120))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({r.id for r in results}) == 1
    docker_client.api.remove_image(results[0].ref)


def test_failed_build_shows_the_end_of_the_log(tmp_path, settings_with, docker_client):
    ctx = tmp_path / "bad"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN echo about-to-fail && exit 3\n")
    with pytest.raises(ImageError) as err:
        build_image(docker_client, ctx, settings_with(), timeout_s=120)
    text = str(err.value)
    assert "about-to-fail" in text and "last lines of the build log" in text


def test_pull_policy_never_refuses_without_pulling(settings_with, docker_client):
    counter = count_requests(docker_client)
    with pytest.raises(ImageError) as err:
        resolve_image(docker_client, "harbor-gym/absent-image:1", settings_with(pull_policy="never"))
    assert "harbor-gym/absent-image:1" in str(err.value) and "image_aliases" in str(err.value)
    assert not any("/images/create" in p for p in counter.paths)
    # an alias resolves to the local image, with ':latest' tried for an untagged name
    info = resolve_image(docker_client, "some/public", settings_with(image_aliases={
        "some/public:latest": "harbor-gym/base:bookworm"}))
    assert info.ref == "harbor-gym/base:bookworm"
