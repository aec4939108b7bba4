"""Hostile: a task's Dockerfile against the host (GYM-10): it may read nothing of the host outside its build context
and, for a task without network, reach no network while it builds. Both of the engine's builders are attacked
(the classic one, and BuildKit, which ``RUN --mount`` selects)."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path

import pytest

from harbor_gym.config import host_settings
from harbor_gym.errors import ImageError
from harbor_gym.sandbox import SandboxSettings
from harbor_gym.sandbox.images import build_image

pytestmark = pytest.mark.docker

BASE = "FROM harbor-gym/base:bookworm\n"


@pytest.fixture
def settings() -> SandboxSettings:
    hs = host_settings()
    return SandboxSettings(pull_policy="never", image_aliases=dict(hs.image_aliases),
                           rootfs_aliases=dict(hs.rootfs_aliases))


@pytest.fixture
def canary(tmp_path):
    """A host file outside every build context, with a unique text."""
    path = Path("/tmp") / f"hg-build-canary-{uuid.uuid4().hex[:8]}"
    text = f"host-secret-{uuid.uuid4().hex}"
    path.write_text(text)
    yield path, text
    path.unlink(missing_ok=True)


def _built_files(docker_client, ref: str) -> bytes:
    """Every regular file's bytes of the image's /out (empty when the build made none)."""
    out = docker_client.containers.run(ref, ["sh", "-c", "cat /out/* 2>/dev/null; true"], remove=True,
                                       network_mode="none")
    return out or b""


def _build(docker_client, tmp_path, settings, dockerfile: str, files=None, **kw):
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (ctx / name).write_text(text)
    return build_image(docker_client, ctx, settings, timeout_s=180, **kw)


@pytest.mark.parametrize("steps", [
    "RUN --mount=type=bind,source=/,target=/h mkdir -p /out && cat /h/{path} > /out/x 2>/dev/null; true\n",
    "RUN --mount=type=bind,source=../../../..{path},target=/h mkdir -p /out && cat /h > /out/x 2>/dev/null; true\n",
    "RUN --mount=type=secret,id=s,src={path} mkdir -p /out && cat /run/secrets/s > /out/x 2>/dev/null; true\n",
    "RUN --mount=type=ssh mkdir -p /out && ls -la / > /out/x; true\n",
    "RUN --mount=type=bind,from=hostctx,target=/h mkdir -p /out && cat /h{path} > /out/x 2>/dev/null; true\n",
    "COPY {path} /out/x\n",
    "ADD {path} /out/x\n",
    "COPY ../../../../..{path} /out/x\n",
])
def test_gym_10_a_dockerfile_reads_nothing_of_the_host_outside_its_context(docker_client, tmp_path, settings,
                                                                          canary, steps):
    # SPEC: GYM-10: bind mounts of '/' or of '..' paths see only the build context, secrets and ssh agents are never
    # passed, named contexts do not exist, COPY/ADD of host paths stay inside the context: the canary's text is in no
    # image (or the build is refused).
    path, text = canary
    try:
        info = _build(docker_client, tmp_path, settings, BASE + steps.format(path=path))
    except ImageError:
        return  # refused: nothing was built
    assert text.encode() not in _built_files(docker_client, info.ref)


def test_gym_10_a_symlink_in_the_context_does_not_carry_a_host_file(docker_client, tmp_path, settings, canary):
    # SPEC: GYM-10, LOAD-13: a link in the context pointing at a host file is sent as a link, never as that file.
    path, text = canary
    ctx = tmp_path / "ctx-link"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(BASE + "COPY link /out/x\n")
    (ctx / "link").symlink_to(path)
    try:
        info = build_image(docker_client, ctx, settings, timeout_s=180)
    except ImageError:
        return
    assert text.encode() not in _built_files(docker_client, info.ref)


@pytest.fixture
def listener():
    """A TCP listener on every host address (the engine's gateway included), counting connections."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    hits: list[str] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except OSError:
                continue
            hits.append(peer[0])
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], hits
    stop.set()
    thread.join(timeout=5)
    server.close()


def _gateway(docker_client) -> str:
    """The host's address on the engine's default bridge (where a build step's network would lead)."""
    import ipaddress

    config = docker_client.api.inspect_network("bridge")["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@pytest.mark.parametrize("mount", ["", "--mount=type=cache,target=/c "])
def test_gym_10_a_no_network_build_reaches_no_network(docker_client, tmp_path, settings, listener, mount):
    # SPEC: GYM-10: a build for a task without network runs its RUN steps with no network (both builders): a
    # connection to a listener on the host's bridge gateway never arrives, and the step sees no interface but lo.
    port, hits = listener
    gateway = _gateway(docker_client)
    probe = (f"RUN {mount}mkdir -p /out && (python3 -c \"import socket; socket.create_connection(('{gateway}', {port}),"
             f" timeout=3)\" && echo reached || echo blocked) > /out/net-{uuid.uuid4().hex[:6]}; "
             "ls /sys/class/net >> /out/ifaces; true\n")
    info = _build(docker_client, tmp_path, settings, BASE + probe)
    out = _built_files(docker_client, info.ref).decode()
    assert "blocked" in out and "reached" not in out
    assert hits == []
    assert set(out.split()) - {"blocked"} <= {"lo"}


def test_gym_10_a_public_build_never_gets_the_hosts_network(docker_client, tmp_path, settings):
    # SPEC: GYM-10: even with network, a build step never runs in the host's network namespace (BuildKit's
    # network.host entitlement is not granted): the request is refused or the step sees its own interfaces.
    host_ifaces = set(p.name for p in Path("/sys/class/net").iterdir())
    try:
        info = _build(docker_client, tmp_path, settings,
                      BASE + "RUN --network=host mkdir -p /out && ls /sys/class/net > /out/ifaces\n", network=True)
    except ImageError:
        return
    seen = set(_built_files(docker_client, info.ref).decode().split())
    assert not ({"docker0"} & seen) and seen != host_ifaces
