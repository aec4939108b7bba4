"""Images for Docker sandboxes: named images through the alias table and the pull policy, and content-addressed,
cached builds of build contexts.

Named images: ``settings.image_aliases`` maps a public name to a local one (exact match, also with ``:latest``
added); then the pull policy decides: ``never`` refuses a missing image without trying to pull, ``missing`` pulls
only an absent one, ``always`` pulls.

Builds: the context is tarred in memory (``.dockerignore`` honoured) with every ``FROM`` line of the Dockerfile
rewritten through the alias table (so ``FROM debian:bookworm-slim`` builds offline); the image is tagged
``harbor-gym/build:<hash16>`` from the content of that context and the alias table, labelled
``io.harbor-gym.managed=true`` and ``io.harbor-gym.cache=build``, reused while unchanged and kept across runs
(``harbor-gym gc --images`` removes them). A build is bounded by the spec's build timeout; a failure raises
`ImageError` with the end of the build log.

BuildKit: a Dockerfile that needs it (``RUN --mount=...``, ``COPY --chmod``, ...) is built by the engine's BuildKit
through the same API (`harbor_gym.sandbox._buildkit` says why not the CLI), FROM lines still through the alias
table; a ``# syntax=`` line whose frontend image is not present locally is dropped with a `BuildWarning`; a heredoc
on an engine before Docker 23, or a BuildKit Dockerfile on an engine without BuildKit, is refused with a clear,
non-retryable `ImageError`.
"""

from __future__ import annotations

import hashlib
import logging
import io
import os
import re
import tarfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from harbor_gym.errors import ImageError, SandboxError
from harbor_gym.sandbox._buildkit import buildkit_build, drop_syntax_line, engine_buildkit, scan_dockerfile
from harbor_gym.sandbox.base import MANAGED_LABEL, SandboxSettings

if TYPE_CHECKING:
    import docker

__all__ = [
    "ImageInfo",
    "CACHE_LABEL",
    "BUILD_REPO",
    "alias_of",
    "rewrite_from_lines",
    "resolve_image",
    "build_image",
    "ensure_image",
    "forget",
    "copy_from_peer",
]

log = logging.getLogger("harbor_gym.sandbox")

#: Label marking harbor_gym's build cache images (value ``"build"``).
CACHE_LABEL = "io.harbor-gym.cache"
#: Repository of built images; the tag is the context's content hash.
BUILD_REPO = "harbor-gym/build"

_LOG_TAIL = 20


@dataclass(frozen=True)
class ImageInfo:
    """What a sandbox needs to know of its image."""

    ref: str
    id: str
    user: str
    workdir: str
    #: The image's size in bytes as the engine reports it (GYM-10: btrfs counts it inside a storage limit).
    size_bytes: int = 0


_cache_lock = threading.Lock()
_info_cache: dict[tuple[int, str], ImageInfo] = {}
_build_locks: dict[str, threading.Lock] = {}


def alias_of(name: str, aliases: Mapping[str, str]) -> str:
    """``name`` through the alias table (exact match, else with ``:latest`` added when untagged)."""
    if name in aliases:
        return aliases[name]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last and f"{name}:latest" in aliases:
        return aliases[f"{name}:latest"]
    return name


def _info_from_attrs(ref: str, attrs: dict) -> ImageInfo:
    config = attrs.get("Config") or {}
    return ImageInfo(ref=ref, id=attrs["Id"], user=config.get("User") or "root",
                     workdir=config.get("WorkingDir") or "/", size_bytes=int(attrs.get("Size") or 0))


def _inspect(client: "docker.DockerClient", ref: str) -> ImageInfo | None:
    import docker.errors

    key = (id(client), ref)
    with _cache_lock:
        hit = _info_cache.get(key)
    if hit is not None:
        return hit
    try:
        attrs = client.api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot inspect image {ref}: {exc}", field="image", retryable=True) from exc
    except Exception as exc:  # transport: the engine does not answer (SandboxUnavailableError, retryable)
        from harbor_gym.sandbox._engine import translate_error

        translate_error(exc, what=f"inspect image {ref}")
    info = _info_from_attrs(ref, attrs)
    with _cache_lock:
        _info_cache[key] = info
    return info


def forget(client: "docker.DockerClient", ref: str) -> None:
    """Drop the cached inspection of ``ref`` (after the engine said it is gone)."""
    with _cache_lock:
        _info_cache.pop((id(client), ref), None)


def _pull(client: "docker.DockerClient", ref: str) -> None:
    import docker.errors

    repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    try:
        client.api.pull(repo, tag=tag or "latest")
    except docker.errors.DockerException as exc:
        raise ImageError(f"cannot pull image {ref}: {exc}", field="image", retryable=True) from exc
    forget(client, ref)


def _peers(client: "docker.DockerClient") -> list[Any]:
    """Other engines' clients this process has: the environment's engine and those of ``EnvConfig.engines``."""
    from harbor_gym.sandbox import engines
    from harbor_gym.sandbox._engine import default_client, engine_key

    mine = engine_key(client)
    found: list[Any] = []
    candidates = list(engines.known_clients())
    try:
        candidates.insert(0, default_client())
    except Exception:  # no engine in the environment: only the sets' engines
        pass
    seen = {mine}
    for peer in candidates:
        key = engine_key(peer)
        if key not in seen:
            seen.add(key)
            found.append(peer)
    return found


def copy_from_peer(client: "docker.DockerClient", ref: str) -> bool:
    """Copy image ``ref`` into ``client``'s engine from another engine of this process that has it (``save`` there,
    ``load`` here, streamed through the API: issue 17). True iff it is present afterwards. Never pulls."""
    from harbor_gym.sandbox._engine import engine_key

    with _cache_lock:
        lock = _build_locks.setdefault(f"copy|{engine_key(client)}|{ref}", threading.Lock())
    with lock:
        if _inspect(client, ref) is not None:
            return True
        for peer in _peers(client):
            try:
                if _inspect(peer, ref) is None:
                    continue
                log.info("copying image %s from engine %s to engine %s", ref, engine_key(peer), engine_key(client))
                client.api.load_image(peer.api.get_image(ref))
            except Exception as exc:  # that peer is out or refused: try the next
                log.warning("copying image %s from %s failed: %s", ref, engine_key(peer), exc)
                continue
            forget(client, ref)
            if _inspect(client, ref) is not None:
                return True
    return False


def resolve_image(client: "docker.DockerClient", name: str, settings: SandboxSettings) -> ImageInfo:
    """The local image for the image name ``name`` (alias table, then pull policy). An image absent from this
    engine but present on another engine of this process is copied from there first (`copy_from_peer`), under
    every policy but ``always``.

    Raises:
        ImageError: the image is absent and the policy forbids or the pull fails (named, with the alias hint).
    """
    ref = alias_of(name, settings.image_aliases)
    policy = settings.pull_policy
    if policy == "always":
        _pull(client, ref)
    info = _inspect(client, ref)
    if info is None and copy_from_peer(client, ref):
        info = _inspect(client, ref)
    if info is None and policy == "missing":
        _pull(client, ref)
        info = _inspect(client, ref)
    if info is None:
        shown = ref if ref == name else f"{ref} (alias of {name})"
        raise ImageError(
            f"image {shown} is not present on this engine and pull_policy is {policy!r}; build or load it, or map "
            f"{name!r} to a local image in image_aliases (host settings file or EnvConfig.image_aliases)",
            field="image",
        )
    return info


# --- builds -------------------------------------------------------------------------------------------------

_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)
_AS = re.compile(r"\s+AS\s+(\S+)", re.IGNORECASE)


def rewrite_from_lines(dockerfile: str, aliases: Mapping[str, str]) -> tuple[str, list[str]]:
    """Rewrite each ``FROM <image>`` through ``aliases`` (``--platform`` flags and ``AS name`` kept; earlier
    stage names, ``scratch`` and ``$ARG`` images left alone). Returns (new text, external base images)."""
    stages: set[str] = set()
    bases: list[str] = []
    out = []
    for line in dockerfile.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _FROM.match(body)
        if m is None:
            out.append(line)
            continue
        head, flags, image, rest = m.groups()
        if image.lower() not in stages and image != "scratch" and "$" not in image:
            image = alias_of(image, aliases)
            bases.append(image)
        stage = _AS.match(rest)
        if stage:
            stages.add(stage.group(1).lower())
        out.append(head + flags + image + rest + line[len(body):])
    return "".join(out), bases


def _context_files(context: Path, dockerfile: str) -> list[str]:
    from docker.utils.build import exclude_paths

    patterns: list[str] = []
    ignore = context / ".dockerignore"
    if ignore.is_file():
        patterns = [ln.strip() for ln in ignore.read_text(encoding="utf-8").splitlines()
                    if ln.strip() and not ln.strip().startswith("#")]
    return sorted(exclude_paths(str(context), patterns, dockerfile=dockerfile))


def _context_tar(context: Path, dockerfile: str, aliases: Mapping[str, str], *, drop_line: int | None = None,
                 tar_format: int = tarfile.PAX_FORMAT) -> tuple[bytes, str, list[str]]:
    """(tar bytes, content hash, external bases) of the context with its Dockerfile rewritten (FROM lines through
    ``aliases``; line ``drop_line``, a ``# syntax=`` directive, blanked)."""
    df_path = context / dockerfile
    if not df_path.is_file():
        raise ImageError(f"no {dockerfile} in the build context", path=context, field="dockerfile")
    original = df_path.read_text(encoding="utf-8")
    if drop_line is not None:
        original = drop_syntax_line(original, drop_line)
    text, bases = rewrite_from_lines(original, aliases)
    digest = hashlib.sha256()
    digest.update(repr(sorted(aliases.items())).encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tar_format) as tar:
        for rel in _context_files(context, dockerfile):
            full = context / rel
            arc = rel.replace(os.sep, "/")
            info = tar.gettarinfo(str(full), arcname=arc)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            digest.update(f"\0{arc}\0{info.type!r}\0{info.mode:o}\0{info.linkname}\0".encode())
            if arc == dockerfile.replace(os.sep, "/"):
                data = text.encode("utf-8")
                info.size = len(data)
                digest.update(data)
                tar.addfile(info, io.BytesIO(data))
            elif info.isreg():
                with open(full, "rb") as fh:
                    data = fh.read()
                digest.update(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue(), digest.hexdigest()[:16], bases


def build_image(
    client: "docker.DockerClient",
    context: Path,
    settings: SandboxSettings,
    *,
    dockerfile: str = "Dockerfile",
    timeout_s: float = 600.0,
    network: bool = False,
) -> ImageInfo:
    """Build (or reuse) the image of the build context ``context``.

    Returns the cached image when one with the same content hash exists. Concurrent calls for the same context
    build once. With pull policy ``never`` a missing base image is refused before building. The build's ``RUN``
    steps get no network (``networkmode=none``, both builders) unless ``network`` (the task's sandbox is public);
    they never get the host's network (BuildKit's ``network.host`` entitlement is never granted), and they see
    only the context: no secrets, ssh agent or named contexts are passed to the builder.

    Raises:
        ImageError: the context is invalid, a base image is missing under ``never``, the build failed (message
            ends with the last lines of the build log) or overran ``timeout_s``.
    """
    import docker.errors
    import requests.exceptions

    context = Path(context)
    if not context.is_dir():
        raise ImageError("build context is not a folder", path=context, field="build_context")
    buildkit, drop_line = _builder_for(client, context, dockerfile)
    data, digest, bases = _context_tar(context, dockerfile, settings.image_aliases, drop_line=drop_line,
                                       tar_format=tarfile.GNU_FORMAT if buildkit else tarfile.PAX_FORMAT)
    tag = f"{BUILD_REPO}:{digest}"
    with _cache_lock:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:
        info = _inspect(client, tag)
        if info is not None:
            return info
        for base in bases:  # a base another engine of this process has is copied, never pulled
            if _inspect(client, base) is None:
                copy_from_peer(client, base)
        if settings.pull_policy == "never":
            for base in bases:
                if _inspect(client, base) is None:
                    raise ImageError(
                        f"base image {base} of {dockerfile} is not present and pull_policy is 'never'; map it to a "
                        "local image in image_aliases", path=context, field="dockerfile")
        deadline = time.monotonic() + timeout_s
        lines: list[str] = []
        try:
            if buildkit:
                error = buildkit_build(client, data, tag=tag, dockerfile=dockerfile, lines=lines,
                                       labels={MANAGED_LABEL: "true", CACHE_LABEL: "build"},
                                       timeout_s=timeout_s, deadline=deadline, now=time.monotonic,
                                       network=network)
            else:
                error = _classic_build(client, data, tag=tag, dockerfile=dockerfile, settings=settings,
                                       timeout_s=timeout_s, deadline=deadline, lines=lines, network=network)
        except (requests.exceptions.Timeout, TimeoutError) as exc:
            raise ImageError(f"build exceeded its timeout of {timeout_s:g} s{_tail(lines)}",
                             path=context, field="build_timeout_s") from exc
        except docker.errors.DockerException as exc:
            raise ImageError(f"build failed: {exc}{_tail(lines)}", path=context, field="dockerfile") from exc
        except requests.exceptions.RequestException as exc:
            raise ImageError(f"build failed: {exc}{_tail(lines)}", path=context, field="dockerfile",
                             retryable=True) from exc
        if error is not None:
            raise ImageError(f"build failed: {error}{_tail(lines)}", path=context, field="dockerfile")
        forget(client, tag)
        info = _inspect(client, tag)
        if info is None:
            raise ImageError(f"build reported success but {tag} is missing{_tail(lines)}", path=context,
                             field="dockerfile")
        return info


def _classic_build(client: "docker.DockerClient", data: bytes, *, tag: str, dockerfile: str,
                   settings: SandboxSettings, timeout_s: float, deadline: float, lines: list[str],
                   network: bool = False) -> str | None:
    """The engine's classic builder through the SDK; returns the build's error or ``None``, log lines appended to
    ``lines``. Raises TimeoutError past ``deadline`` and what the SDK raises."""
    stream = client.api.build(
        fileobj=io.BytesIO(data), custom_context=True, dockerfile=dockerfile, tag=tag, rm=True,
        forcerm=True, pull=settings.pull_policy == "always", decode=True, timeout=max(1, int(timeout_s)),
        labels={MANAGED_LABEL: "true", CACHE_LABEL: "build"}, network_mode=None if network else "none",
    )
    error = None
    for chunk in stream:
        if "stream" in chunk:
            lines.extend(chunk["stream"].rstrip("\n").splitlines())
        if "error" in chunk:
            error = chunk["error"]
            lines.append(error)
        if time.monotonic() > deadline:
            raise TimeoutError("build deadline")
    return error


class BuildWarning(UserWarning):
    """A Dockerfile was changed to build here (a ``# syntax=`` frontend that is not available locally dropped)."""


_buildkit_cache: dict[int, tuple[bool, int]] = {}


def _engine_buildkit(client: "docker.DockerClient") -> tuple[bool, int]:
    key = id(client)
    with _cache_lock:
        hit = _buildkit_cache.get(key)
    if hit is not None:
        return hit
    try:
        response = client.api._get(client.api._url("/_ping"))
        answer = engine_buildkit(response.headers)
    except Exception as exc:  # transport: the engine does not answer (SandboxUnavailableError, retryable)
        from harbor_gym.sandbox._engine import translate_error

        translate_error(exc, what="ping the engine")
    with _cache_lock:
        _buildkit_cache[key] = answer
    return answer


def _builder_for(client: "docker.DockerClient", context: Path, dockerfile: str) -> tuple[bool, int | None]:
    """(build with BuildKit?, line of a ``# syntax=`` directive to drop or ``None``) for ``context/dockerfile``.

    A Dockerfile that needs BuildKit (`scan_dockerfile`: ``RUN --mount``, ``COPY --chmod``, ...) is built with it
    when the engine has it. A ``# syntax=`` frontend image that is not present locally is dropped with a
    `BuildWarning` (fetching it would leave the machine); one that is present is kept and built with BuildKit.

    Raises:
        ImageError (not retryable): the Dockerfile needs BuildKit and the engine has none; a heredoc, which the
            built-in Dockerfile frontend of a Docker engine before 23 cannot parse.
    """
    path = context / dockerfile
    if not path.is_file():
        return False, None
    scan = scan_dockerfile(path.read_text(encoding="utf-8"))
    drop = None
    keep_syntax = False
    if scan.syntax is not None:
        frontend, line = scan.syntax
        if _inspect(client, frontend) is None:
            warnings.warn(BuildWarning(f"{path}:{line}: '# syntax={frontend}' dropped: that frontend image is not "
                                       "present on this engine and builds stay offline; the engine's built-in "
                                       "Dockerfile frontend builds it"), stacklevel=3)
            drop = line
        else:
            keep_syntax = True
    if scan.needs is None and not keep_syntax:
        return False, drop
    has_buildkit, major = _engine_buildkit(client)
    why = scan.needs or f"line {scan.syntax[1]}: '# syntax=' frontend"
    if not has_buildkit:
        raise ImageError(f"{dockerfile} needs BuildKit ({why}) and this engine offers none (a Linux Docker engine "
                         "with API 1.39+ has it); rewrite the Dockerfile without BuildKit features or use such an "
                         "engine", path=context, field="dockerfile")
    if scan.heredoc_line is not None and not keep_syntax and 0 < major < 23:
        raise ImageError(f"{dockerfile} line {scan.heredoc_line} uses a heredoc (RUN <<EOF), which the built-in "
                         f"Dockerfile frontend of this Docker {major} engine cannot parse (it needs Docker 23+ or a "
                         "'# syntax=docker/dockerfile:1.4' frontend image present locally); write the script to a "
                         "file and COPY it, or use printf", path=context, field="dockerfile")
    return True, drop


def _tail(lines: list[str]) -> str:
    if not lines:
        return ""
    return "\n--- last lines of the build log ---\n" + "\n".join(lines[-_LOG_TAIL:])


def ensure_image(client: "docker.DockerClient", spec, settings: SandboxSettings) -> ImageInfo:
    """The image of ``spec`` (a `SandboxSpec`): its build context built, or its image name resolved."""
    if spec.build_context is not None:
        return build_image(client, Path(spec.build_context), settings, dockerfile=spec.dockerfile,
                           timeout_s=spec.build_timeout_s,
                           network=bool(spec.network if spec.build_network is None else spec.build_network))
    if not spec.image:
        raise SandboxError("spec names neither an image nor a build context", field="image")
    return resolve_image(client, spec.image, settings)
