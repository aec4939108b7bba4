"""`collect_garbage`: removes labelled resources whose run's lease is dead, never a live run's, never unlabelled
ones."""

from __future__ import annotations

import pytest

from harbor_gym.sandbox import DockerSandbox, SandboxSpec
from harbor_gym.sandbox.gc import collect_garbage

pytestmark = pytest.mark.docker

BASE_IMAGE = "harbor-gym/base:bookworm"


def test_gc_removes_dead_runs_only(settings_with, docker_client):
    dead = docker_client.containers.run(
        BASE_IMAGE, ["sleep", "300"], detach=True, init=True, network_mode="none",
        labels={"io.harbor-gym.managed": "true", "io.harbor-gym.run": "crashed-run-without-lease"},
    )
    stranger = docker_client.containers.run(BASE_IMAGE, ["sleep", "300"], detach=True, init=True,
                                            network_mode="none")
    try:
        with DockerSandbox(SandboxSpec(image=BASE_IMAGE, name_hint="live"), settings_with()) as live:
            report = collect_garbage(client=docker_client)
            assert dead.name in report.containers
            assert live.name in report.kept_live and live.name not in report.containers
            assert live.is_alive()
            names = {n.lstrip("/") for c in docker_client.api.containers(all=True) for n in c["Names"] or []}
            assert dead.name not in names and stranger.name in names
            # SPEC: GYM-10 — the engine's reaper is not a sandbox: gc neither counts nor removes it
            from harbor_gym.sandbox._reaper import REAPER_NAME

            assert REAPER_NAME in names and REAPER_NAME not in report.containers + report.kept_live
    finally:
        stranger.remove(force=True)
        try:
            dead.remove(force=True)
        except Exception:
            pass


def test_gc_images_removes_the_build_cache(tmp_path, settings_with, docker_client):
    import docker.errors

    from harbor_gym.sandbox.images import build_image

    (tmp_path / "Dockerfile").write_text(f"FROM debian:bookworm-slim\nRUN echo {tmp_path.name} > /m\n")
    info = build_image(docker_client, tmp_path, settings_with(), timeout_s=120)
    kept = collect_garbage(client=docker_client)  # without images=True the cache stays
    assert info.ref not in kept.images and docker_client.api.inspect_image(info.ref)
    report = collect_garbage(images=True, client=docker_client)
    assert info.ref in report.images
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.api.inspect_image(info.ref)
