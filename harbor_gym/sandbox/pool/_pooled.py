"""`PooledSandbox`: the sandbox a pool hands out; its `stop` retires it to the pool's reaper (no removal).

Every other call goes to the backend sandbox. A retired sandbox never returns to the pool (SPEC GYM-2).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from harbor_gym.errors import SandboxError
from harbor_gym.sandbox.base import ExecResult, Sandbox, SandboxState

if TYPE_CHECKING:
    from pathlib import Path

    from harbor_gym.sandbox.pool._pool import SandboxPool

__all__ = ["PooledSandbox"]


class PooledSandbox:
    """A sandbox handed out by a pool: every call goes to the backend sandbox, except `stop`, which hands it to
    the pool's reaper (teardown off the caller's path) and returns at once. After `stop` the sandbox is never used
    again by anyone; ``state`` reads ``STOPPED`` from then on."""

    def __init__(self, inner: Sandbox, pool: "SandboxPool", *, warm: bool) -> None:
        self._inner = inner
        self._pool = pool
        self._stopped = False
        self._removed = threading.Event()
        #: True iff the sandbox came from the pool's ready set (False: started by the claim itself).
        self.warm = warm
        self.backend = inner.backend
        self.name = inner.name

    @property
    def inner(self) -> Sandbox:
        """The backend sandbox (for inspection)."""
        return self._inner

    @property
    def state(self) -> SandboxState:
        return SandboxState.STOPPED if self._stopped else self._inner.state

    @property
    def workdir(self) -> str:
        return self._inner.workdir

    @property
    def default_user(self) -> str:
        return self._inner.default_user

    def start(self) -> None:
        """A pooled sandbox is handed out running; starting it again is refused like on any backend."""
        raise SandboxError(f"sandbox {self.name} was already started (handed out running by its pool)")

    def exec(self, command: str | Sequence[str], *, timeout: float | None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None, stdin: bytes | None = None) -> ExecResult:
        return self._inner.exec(command, timeout=timeout, user=user, env=env, cwd=cwd, stdin=stdin)

    def put(self, local: "Path", dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        self._inner.put(local, dest, owner=owner, mode=mode)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        self._inner.put_bytes(data, dest, owner=owner, mode=mode)

    def get(self, src: str, dest_dir: "Path") -> "Path":
        return self._inner.get(src, dest_dir)

    def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        return self._inner.read_file(path, max_bytes=max_bytes)

    def copy_out(self, src: str, dest: "Path", *, budget, reserved=None):
        return self._inner.copy_out(src, dest, budget=budget, reserved=reserved)

    def is_alive(self) -> bool:
        return not self._stopped and self._inner.is_alive()

    def stop(self) -> None:
        """Retire the sandbox: the pool's reaper removes it in the background. Idempotent; never raises."""
        if self._stopped:
            return
        self._stopped = True
        self._pool._retire(self._inner, self._removed)

    @property
    def stopped(self) -> bool:
        """True once `stop` was called (the sandbox is retired; it may still be being removed)."""
        return self._stopped

    def wait_removed(self, timeout: float | None = 60.0) -> bool:
        """Wait until the retired sandbox is removed (by the reaper or by the pool's close). Returns True iff it
        was; False at once when `stop` was never called."""
        if not self._stopped:
            return False
        return self._removed.wait(timeout)

    def __getattr__(self, name: str) -> Any:  # backend extras (container_id, spec, engine_requests, ...)
        return getattr(self._inner, name)

    def __enter__(self) -> "PooledSandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PooledSandbox({self._inner!r}, warm={self.warm})"
