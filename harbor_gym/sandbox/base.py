"""The sandbox contract: `SandboxSpec` (what to start), `ExecResult`, `SandboxSettings` and the `Sandbox` protocol.

This layer knows nothing of tasks, turns or rewards. The episode layer derives a `SandboxSpec` from a task; a
backend (``docker``, ``local``) turns it into a running `Sandbox`. Every backend honours the same contract, checked
by one contract test suite parametrised over the backends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from harbor_gym.config import EnvConfig
    from harbor_gym.sandbox.channel import CopyBudget, CopyReport

__all__ = [
    "SandboxSpec",
    "SandboxSettings",
    "ExecResult",
    "Sandbox",
    "SandboxState",
    "MANAGED_LABEL",
    "RUN_LABEL",
    "truncate_output",
]

#: Every container, network, volume and image harbor_gym creates carries this label (value ``"true"``).
MANAGED_LABEL = "io.harbor-gym.managed"
#: The id of the host process run that created the resource; ``harbor-gym gc`` uses it with the lease.
RUN_LABEL = "io.harbor-gym.run"

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class SandboxSpec:
    """What to start. Exactly one of ``image`` and ``build_context`` is set.

    Attributes:
        image: an image name, resolved through the alias table and the pull policy.
        build_context: a folder holding ``dockerfile``; built into a content-addressed, cached image.
        dockerfile: the Dockerfile's path relative to ``build_context``.
        build_timeout_s: bound on the build.
        workdir: the working folder of commands; ``None``: the image's WORKDIR, else ``/``.
        create_workdir: ``True``: ``workdir`` is created at start when the image lacks it. ``False``: it is only
            the folder commands run in (Harbor's semantics): never created by the backend, so a command run there
            while it is missing raises `SandboxPathError` (``field="cwd"``).
        env: environment of every command (an exec's ``env`` is laid over it).
        user: the default user of commands; ``None``: the image's default user.
        cpus, memory_mb, storage_mb, pids_limit, gpus: limits; ``None`` = no limit. A backend that cannot enforce
            a given limit exactly refuses the spec at start (`SandboxUnavailableError`), never ignores it.
        network: ``False`` = no network interface but loopback.
        build_network: whether a build of ``build_context`` gets network (its ``RUN`` steps); ``None``: as
            ``network``. Never the host's network.
        host_service_port: a TCP port of a service on the trainer's host that this sandbox may reach (and no other
            host port; `harbor_gym.sandbox.host_route`). A no-network sandbox then gets an interface that reaches
            only that port on the host, nothing else (no egress, no siblings). Start is refused unless a route to
            the port is open (`host_route.open_route`); `Sandbox.host_service_address` names it inside.
        tmpfs: mount point -> size in MiB of size-bounded tmpfs mounts.
        labels: extra labels; the managed and run labels are always added.
        name_hint: a readable part of the sandbox's name (e.g. the task id).
    """

    image: str | None = None
    build_context: Path | None = None
    dockerfile: str = "Dockerfile"
    build_timeout_s: float = 600.0
    workdir: str | None = None
    create_workdir: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    pids_limit: int | None = None
    gpus: int | None = None
    network: bool = False
    build_network: bool | None = None
    host_service_port: int | None = None
    tmpfs: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    name_hint: str = "sandbox"

    def __post_init__(self) -> None:
        if (self.image is None) == (self.build_context is None):
            raise ValueError("SandboxSpec needs exactly one of image and build_context")
        port = self.host_service_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"SandboxSpec.host_service_port must be a TCP port (1..65535), got {port!r}")
        # Freeze the mappings so a spec can be shared (pools key on it) and pickled.
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "tmpfs", MappingProxyType(dict(self.tmpfs)))
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    def __reduce__(self):
        state = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for key in ("env", "tmpfs", "labels"):
            state[key] = dict(state[key])
        return (_rebuild_spec, (state,))

    def __hash__(self) -> int:
        return hash(self.key())

    def key(self) -> tuple:
        """A hashable identity of the spec (pools keep one warm set per key)."""
        return tuple(
            (f, tuple(sorted(v.items())) if isinstance(v, Mapping) else (str(v) if isinstance(v, Path) else v))
            for f, v in ((f, getattr(self, f)) for f in self.__dataclass_fields__)
        )


def _rebuild_spec(state: dict) -> SandboxSpec:
    return SandboxSpec(**state)


@dataclass(frozen=True)
class SandboxSettings:
    """Host-level settings every backend reads; build with `SandboxSettings.from_config`.

    Attributes:
        pull_policy: ``"missing"``, ``"never"`` or ``"always"``.
        image_aliases: public image name -> local image name (explicit, never probed).
        rootfs_aliases: image name -> unpacked root filesystem folder (local backend).
        lease_ttl_s: a sandbox whose lease is not renewed for this long removes itself.
        output_cap_bytes: cap of each of an exec's stdout and stderr.
        labels: extra labels on every container (after the spec's; the managed and run labels always win).
        unfiltered_network: `EnvConfig.unfiltered_network`: where a backend cannot filter a public network from
            the host, ``"refuse"`` refuses such a spec at start, ``"allow"`` runs it unfiltered (GYM-10).
    """

    pull_policy: str = "missing"
    image_aliases: Mapping[str, str] = field(default_factory=dict)
    rootfs_aliases: Mapping[str, str] = field(default_factory=dict)
    lease_ttl_s: float = 60.0
    output_cap_bytes: int = 1 << 20
    labels: Mapping[str, str] = field(default_factory=dict)
    unfiltered_network: str = "refuse"

    @classmethod
    def from_config(cls, config: "EnvConfig") -> "SandboxSettings":
        """The settings in force for ``config`` (its own fields, else the host settings file)."""
        return cls(
            pull_policy=config.effective_pull_policy().value,
            image_aliases=MappingProxyType(config.effective_image_aliases()),
            rootfs_aliases=MappingProxyType(config.effective_rootfs_aliases()),
            lease_ttl_s=config.lease_ttl_s,
            output_cap_bytes=config.output_cap_bytes,
            labels=MappingProxyType(dict(config.labels)),
            unfiltered_network=config.unfiltered_network,
        )

    def __reduce__(self):
        return (
            SandboxSettings,
            (self.pull_policy, dict(self.image_aliases), dict(self.rootfs_aliases), self.lease_ttl_s,
             self.output_cap_bytes, dict(self.labels), self.unfiltered_network),
        )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command. A non-zero exit code or a timeout is a result, not an error.

    Attributes:
        exit_code: the command's exit status (``-1`` when it was killed at its timeout and none is known).
        stdout, stderr: decoded output (UTF-8, invalid bytes replaced), each capped; a cut one ends with a marker.
        duration_s: host wall time of the call.
        timed_out: the command overran its timeout and its whole process group was killed.
        stdout_truncated, stderr_truncated: the output was cut at the cap.
        wrapper_lost: the backend's own wrapper around the command was killed before it could report, while the
            sandbox lives on (a process of the sandbox killed it, e.g. ``kill -9 -1`` run by the command's user;
            GYM-12). ``exit_code`` is then the engine's. Only backends with such a wrapper (Docker) set it.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wrapper_lost: bool = False

    @property
    def ok(self) -> bool:
        """True iff the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


def truncate_output(data: bytes, cap: int) -> tuple[str, bool]:
    """Decode ``data`` and cut it to ``cap`` bytes with a visible marker. Returns (text, was_cut)."""
    if len(data) <= cap:
        return data.decode("utf-8", errors="replace"), False
    marker = f"\n[... harbor_gym: output cut at {cap} bytes of {len(data)} ...]\n"
    return data[:cap].decode("utf-8", errors="replace") + marker, True


class SandboxState(enum.Enum):
    """Lifecycle of a sandbox: created -> running -> stopped (stop is idempotent; a failed start is stopped)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


@runtime_checkable
class Sandbox(Protocol):
    """One running sandbox. Use as a context manager; ``stop()`` is idempotent and leaves nothing behind.

    All paths are absolute paths inside the sandbox. Every call that may block takes a bound.
    """

    #: ``"docker"``, ``"podman"`` or ``"local"``.
    backend: str
    #: A unique, readable name (container name, or the local sandbox's id).
    name: str

    @property
    def state(self) -> SandboxState: ...

    @property
    def workdir(self) -> str:
        """The effective working folder (spec's, else the image's WORKDIR, else ``/``)."""

    @property
    def default_user(self) -> str:
        """The image's default user as configured (``"root"`` when the image names none)."""

    @property
    def host_service_address(self) -> str | None:
        """``"IP:PORT"`` through which commands inside reach the spec's ``host_service_port`` (known after start);
        ``None`` when the spec names no port."""

    def start(self) -> None:
        """Start the sandbox (build or resolve its image first). Raises `SandboxError` subclasses; after a raise
        nothing of it is left running."""

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` (a ``str`` through ``/bin/sh -c``, a sequence as argv) and return when it ends.

        Returns as soon as the command itself ends, even if it left background processes behind. On timeout the
        command's whole process group is killed and ``timed_out`` is set. ``timeout=None`` waits without bound.

        Raises:
            SandboxError: the sandbox is gone or the backend failed (never for a non-zero exit).
        """

    def put(self, local: Path, dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        """Copy a local file to the path ``dest``, or a local folder's contents into the folder ``dest``
        (merged: same names replaced, nothing deleted, missing folders created), keeping permission bits.
        ``owner`` (``"uid:gid"``, ``"name"`` or ``"name:group"``) is applied to every placed entry and the
        destination folder; ``mode`` to a placed file (for a file) or to ``dest`` itself (for a folder)."""

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        """Write ``data`` as the file ``dest`` (parents created)."""

    def get(self, src: str, dest_dir: Path) -> Path:
        """Copy the file or folder ``src`` into the local folder ``dest_dir`` as ``dest_dir/<basename>``.

        Members that would escape ``dest_dir`` (absolute paths, ``..``, links pointing out) are refused with
        `ArchiveError` and nothing of the archive is written. Raises `SandboxPathError` if ``src`` is missing."""

    def copy_out(self, src: str, dest: Path, *, budget: "CopyBudget",
                 reserved: Mapping[str, int] | None = None) -> "CopyReport":
        """GYM-10, the trusted channel: copy the file or folder ``src`` to the host path ``dest`` (a folder's
        contents into the folder ``dest``) through a path no sandbox process can write into or spoof (Docker: the
        engine's archive API; local: host-side ``O_NOFOLLOW`` reads beneath the sandbox's root).

        Only folders and regular files are created; links are recorded, never created or followed; fifos,
        devices and sockets are refused; names stay below ``dest``; real bytes read are capped by ``budget``
        (per file and per turn) and ``reserved`` names (relative path -> cap) are read up to their cap + 1 byte
        outside the turn budget. See `harbor_gym.sandbox.channel`.

        Raises:
            SandboxPathError: ``src`` does not exist. SandboxError: the sandbox is gone or the backend failed.
        """

    def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` bytes of the regular file ``path``, or ``None`` if it does not exist."""

    def is_alive(self) -> bool:
        """True iff the sandbox is running and can execute commands."""

    def stop(self) -> None:
        """Stop and remove the sandbox and everything it created. Idempotent; never raises for a dead sandbox."""

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc_info) -> None: ...
