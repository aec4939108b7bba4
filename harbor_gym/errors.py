"""The exception hierarchy of harbor_gym: one root, domain errors that carry where, what and which SPEC rule.

Every error harbor_gym raises on purpose derives from :class:`HarborGymError`, so ``except HarborGymError`` is the
catch-all. Errors build their message from their attributes (``path``, ``field``, ``rule``, ``retryable``), so a
message always names the file or step, the field and the rule. Where SPEC.md names a builtin (GYM-7, SES-3), the
error subclasses that builtin too.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "HarborGymError",
    "SubEnvError",
    "TaskLoadError",
    "SeedRefusedError",
    "EnvTemplateError",
    "SeedError",
    "SandboxError",
    "SandboxUnavailableError",
    "ImageError",
    "ExecTimeoutError",
    "ArchiveError",
    "SandboxPathError",
    "VerifierError",
    "ResetNeededError",
    "SessionMismatchError",
    "ConfigError",
    "TargetNotFoundError",
    "DatasetError",
]


class HarborGymError(Exception):
    """Root of every error harbor_gym raises on purpose.

    Attributes:
        path: the file or folder concerned, if any.
        field: the TOML field, step name or option concerned, if any.
        rule: the SPEC.md rule ID (e.g. ``"LOAD-3"``), if one applies.
        retryable: whether the same call may succeed when repeated (an outage), never for bad input.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        field: str | None = None,
        rule: str | None = None,
        retryable: bool = False,
    ) -> None:
        self.reason = message
        self.path = Path(path) if path is not None else None
        self.field = field
        self.rule = rule
        self.retryable = retryable
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.field:
            where.append(self.field)
        prefix = ": ".join(where)
        text = f"{prefix}: {self.reason}" if prefix else self.reason
        if self.rule and self.rule not in self.reason:  # a reason that already cites its rule is not repeated
            text += f" [{self.rule}]"
        return text

    def __reduce__(self):  # errors cross process boundaries (vector envs, Ray): keep keyword attributes
        return (
            _rebuild_error,
            (type(self), self.reason, str(self.path) if self.path else None, self.field, self.rule, self.retryable),
        )


def _rebuild_error(cls, reason, path, field, rule, retryable):
    obj = cls.__new__(cls)
    HarborGymError.__init__(obj, reason, path=path, field=field, rule=rule, retryable=retryable)
    return obj


class ConfigError(HarborGymError, ValueError):
    """An `EnvConfig` value or a settings file is invalid."""


class TaskLoadError(HarborGymError, ValueError):
    """A task folder or dataset is refused at load (SPEC LOAD-1..16). Never retryable."""


class SeedRefusedError(HarborGymError):
    """``reset()`` refuses the task before any sandbox starts (SPEC LOAD-20..24). Never retryable."""


class EnvTemplateError(SeedRefusedError):
    """An FMT-15 env template names a host variable that is unset and has no default (SPEC LOAD-23).

    Attributes:
        variable: the host variable's name (``field`` is the env key holding the template).
    """

    def __init__(self, message: str, *, variable: str | None = None, **kwargs) -> None:
        self.variable = variable
        super().__init__(message, **kwargs)

    def __reduce__(self):
        rebuild, args = super().__reduce__()
        return (_rebuild_template_error, (rebuild, args, self.variable))


def _rebuild_template_error(rebuild, args, variable):
    obj = rebuild(*args)
    obj.variable = variable
    return obj


class SubEnvError(HarborGymError):
    """Issue 15: a sub-env of `HarborVectorEnv` failed for a reason a retry cannot mend (``on_error="raise"``), or
    failed too many times in a row. The message names the slot, the task and the cause.

    Attributes:
        slot: the sub-env's index. task_id: its task (``None`` when unknown). cause: the failure, one line.
    """

    def __init__(self, message: str, *, slot: int | None = None, task_id: str | None = None,
                 cause: str | None = None, **kwargs) -> None:
        self.slot, self.task_id, self.cause = slot, task_id, cause
        super().__init__(message, **kwargs)


class SeedError(HarborGymError):
    """Seeding failed after its retries (SPEC GYM-2): a seed healthcheck failed or the sandbox was out."""


class SandboxError(HarborGymError):
    """A sandbox could not do what was asked: it died, the engine is unreachable, a copy failed."""


class SandboxUnavailableError(SandboxError):
    """No backend can run the requested sandbox here (no engine, no rootfs, an unsupported limit)."""


class ImageError(SandboxError):
    """An image could not be built or found (the message names the image and, for builds, shows the log's end)."""


class ExecTimeoutError(SandboxError):
    """A host-side wait for a sandbox call overran its bound (the command's own timeout is a result, not this)."""


class ArchiveError(SandboxError):
    """An archive coming back from a sandbox was refused (absolute paths, ``..``, escaping links)."""


class SandboxPathError(SandboxError):
    """A path asked for inside a sandbox does not exist."""


class VerifierError(HarborGymError):
    """The verifier could not run at all (SPEC VER-11 masks the turn)."""


class ResetNeededError(HarborGymError, RuntimeError):
    """``step()`` was called before ``reset()`` or after the episode ended (SPEC GYM-7)."""


class SessionMismatchError(HarborGymError, ValueError):
    """A continued session was stepped with a different agent object (SPEC SES-3)."""


class TargetNotFoundError(HarborGymError, LookupError):
    """``harbor_gym.make(x)`` / ``harbor-gym run x``: ``x`` names no task folder, no registered id and no dataset of
    the registry in force. The message is "no such task folder or registered id: x"."""


class DatasetError(HarborGymError):
    """A dataset named ``NAME@VERSION`` cannot be had from the registry: unknown name or version, an unreadable
    registry file, a repository that cannot be fetched, a commit that is not there, a task path missing at that
    commit (``retryable`` only when fetching failed)."""
