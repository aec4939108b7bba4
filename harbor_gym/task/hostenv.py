"""Which host variables a task reads, checked against `EnvConfig.host_env_allowlist` (FMT-15, LOAD-23).

Pure: reads the loaded `Task` and the given host environment, starts nothing. `check_host_env` is what ``reset()``
refuses at seed (through `harbor_gym.episode`) and what ``harbor-gym check`` reports, so that a task that would read
a host variable outside the allowlist (the trainer's secrets) fails before any sandbox, naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from harbor_gym.errors import EnvTemplateError
from harbor_gym.task.resolved import Task
from harbor_gym.task.text import resolve_env_templates

__all__ = ["env_tables", "check_host_env"]


def env_tables(task: Task) -> list[tuple[str, Mapping[str, str]]]:
    """``(where, env)`` of every env table FMT-15 applies to: ``[environment].env``, ``[solution].env``, each
    step's verifier ``env`` and its verifier environment's ``env``."""
    tables: list[tuple[str, Mapping[str, str]]] = [
        ("environment.env", task.config.environment.env),
        ("solution.env", task.config.solution.env),
    ]
    for step in task.steps:
        tables.append((f"steps.{step.name}.verifier.env", step.verifier_env))
        if step.verifier_environment is not None:
            tables.append((f"steps.{step.name}.verifier.environment.env", step.verifier_environment.env))
    return tables


def check_host_env(task: Task, allowlist: Iterable[str], host_env: Mapping[str, str] | None = None) -> None:
    """LOAD-23 over every env table of ``task``: each template resolves, reading only ``allowlist``'s variables.

    Raises:
        EnvTemplateError: the first template naming a variable outside ``allowlist`` (or unset, without a default),
            with ``path`` = task.toml, ``field`` = the table and key, ``variable`` = the variable.
    """
    allowed = tuple(allowlist)
    environ = os.environ if host_env is None else host_env
    for where, env in env_tables(task):
        try:
            resolve_env_templates(env, environ, allowlist=allowed)
        except EnvTemplateError as exc:
            raise EnvTemplateError(exc.reason, path=task.path / "task.toml", field=f"{where}.{exc.field}",
                                   rule="LOAD-23", variable=exc.variable) from None
