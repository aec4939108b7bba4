"""`resolve_agent`: the ``--agent`` spec of ``harbor-gym run`` as an `AgentSpec` that makes one agent per episode.

Specs (SPEC GYM-4 says what an action can be):

- ``oracle``: `Oracle()` every turn (ORACLE-1/2).
- ``script:FILE``: FILE's text is the ``str`` action of every turn (a bash script run in the workdir as the turn's
  agent user). ``script:DIR`` (a folder): each turn runs ``DIR/<step_name>.sh``, else ``DIR/default.sh``, else
  the no-op ``:``; the folder must hold at least one ``.sh`` file.
- ``module:Class`` (``package.module:Class``, or ``path/to/file.py:Class``): the class is imported (the current
  folder is on the import path) and instantiated once per episode with the ``--agent-arg`` arguments (none by
  default); it must have ``run(turn)``.
- ``cmd:COMMAND``: `harbor_gym.agents.CommandAgent` (issue 18): the command line runs in the sandbox as every
  turn's agent (``{instruction}`` replaced by the shell-quoted instruction, which is also in
  ``/logs/agent/instruction.md``); an installed harness. With ``--base-url`` the run gets a model upstream
  (`EnvConfig.model_upstream`) and the harness's calls are captured through the episode's proxy.
- ``chat``: `harbor_gym.agents.ChatAgent` over an OpenAI-compatible endpoint (GYM-13), made once per episode with
  ``model``, ``base_url`` and the ``--agent-arg`` arguments (``max_steps=20``, ``temperature=0.7``,
  ``tool_mode=text``...). Its key is read from the environment variable ``api_key_env`` (default
  ``OPENAI_API_KEY``) in the process that calls the model, never from the command line.

``--agent-arg KEY=VALUE`` values are read as JSON when they parse (``3``, ``0.5``, ``true``, ``null``,
``{"top_k": 20}``), else kept as strings.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harbor_gym.errors import ConfigError

__all__ = ["AgentSpec", "EpisodeAgent", "resolve_agent", "parse_agent_args", "AGENT_KINDS"]

#: What ``--agent`` accepts (``--help`` lists them).
AGENT_KINDS = ("oracle", "script:FILE", "module:Class", "cmd:COMMAND", "chat")

_MODULE_CLASS = re.compile(r"^(?P<module>[^:]+):(?P<cls>[A-Za-z_][A-Za-z0-9_.]*)$")


@dataclass(frozen=True)
class EpisodeAgent:
    """What one episode needs: the agent announced at ``reset`` (GYM-4) and the action of each turn."""

    announced: Any
    action_for: Callable[[str], Any]


@dataclass(frozen=True)
class AgentSpec:
    """A resolved ``--agent``: ``label`` goes into every row's ``agent`` field; ``new()`` makes one episode's agent."""

    label: str
    new: Callable[[], EpisodeAgent]


def _error(spec: str, why: str) -> ConfigError:
    return ConfigError(f"{spec!r}: {why} (use oracle, script:FILE, module:Class, cmd:COMMAND or chat)",
                       field="--agent", rule="GYM-4")


def parse_agent_args(items: Sequence[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` as constructor arguments (values parsed as JSON when they parse, else strings).

    Raises:
        ConfigError: an item without ``=`` or with an empty or non-identifier key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"{item!r}: expected KEY=VALUE with KEY a Python name", field="--agent-arg")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _chat(kwargs: Mapping[str, Any]) -> AgentSpec:
    from harbor_gym.agents import ChatAgent

    for required in ("model", "base_url"):
        if not kwargs.get(required):
            raise _error("chat", f"needs --{required.replace('_', '-')}")
    if "api_key" in kwargs:
        raise _error("chat", "the API key is read from the variable named by --api-key-env, never given as an "
                             "argument")
    try:
        ChatAgent(**kwargs)  # fail now, once, with a one-line error
    except (TypeError, ValueError) as exc:
        raise _error("chat", str(exc)) from exc

    def new() -> EpisodeAgent:
        agent = ChatAgent(**kwargs)
        return EpisodeAgent(announced=agent, action_for=lambda step: agent)

    return AgentSpec(f"chat:{kwargs['model']}", new)


def _oracle() -> EpisodeAgent:
    from harbor_gym.agents import Oracle

    oracle = Oracle()
    return EpisodeAgent(announced=oracle, action_for=lambda step: oracle)


def _script(spec: str, target: str) -> AgentSpec:
    from harbor_gym.agents import ScriptAgent

    path = Path(target)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _error(spec, f"cannot read {target}: {exc}") from exc
        return AgentSpec(spec, lambda: EpisodeAgent(ScriptAgent(text), lambda step: text))
    if path.is_dir():
        scripts: dict[str, str] = {}
        for file in sorted(path.glob("*.sh")):
            try:
                scripts[file.stem] = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise _error(spec, f"cannot read {file}: {exc}") from exc
        if not scripts:
            raise _error(spec, f"the folder {target} holds no .sh file")
        default = scripts.get("default", ":")

        def action_for(step: str) -> str:
            return scripts.get(step, default)

        return AgentSpec(spec, lambda: EpisodeAgent(ScriptAgent(default), action_for))
    raise _error(spec, f"no such file or folder: {target}")


def _command(spec: str, command: str) -> AgentSpec:
    from harbor_gym.agents import CommandAgent

    try:
        agent = CommandAgent(command)
    except ValueError as exc:
        raise _error(spec, str(exc)) from exc
    return AgentSpec(spec, lambda: EpisodeAgent(agent, lambda step: agent))


def _import_class(spec: str, module_name: str, class_path: str) -> type:
    if module_name.endswith(".py"):
        file = Path(module_name)
        if not file.is_file():
            raise _error(spec, f"no such file: {module_name}")
        name = f"_harbor_gym_agent_{abs(hash(str(file.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(name, file)
        if loader_spec is None or loader_spec.loader is None:
            raise _error(spec, f"cannot import {module_name}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's module failed to import: name it, one line
            raise _error(spec, f"importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    else:
        cwd = str(Path.cwd())
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise _error(spec, f"cannot import module {module_name!r}: {exc}") from exc
        except Exception as exc:  # the user's module failed while importing
            raise _error(spec, f"importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in class_path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise _error(spec, f"{module_name} has no {class_path}")
    if not isinstance(obj, type):
        raise _error(spec, f"{class_path} is not a class")
    if not callable(getattr(obj, "run", None)):
        raise _error(spec, f"{class_path} has no run(turn) method")
    return obj


def _module(spec: str, module_name: str, class_path: str, kwargs: Mapping[str, Any]) -> AgentSpec:
    cls = _import_class(spec, module_name, class_path)
    try:
        cls(**kwargs)  # fail now, once, with a one-line error, rather than in every episode
    except Exception as exc:  # the user's constructor: report, never crash the CLI
        raise _error(spec, f"{class_path}() failed: {type(exc).__name__}: {exc}") from exc

    def new() -> EpisodeAgent:
        agent = cls(**kwargs)
        return EpisodeAgent(announced=agent, action_for=lambda step: agent)

    return AgentSpec(spec, new)


def resolve_agent(spec: str, agent_args: Mapping[str, Any] | None = None) -> AgentSpec:
    """Resolve an ``--agent`` spec (see the module docstring) with its constructor arguments ``agent_args`` (for
    ``module:Class`` and ``chat``).

    Raises:
        ConfigError: the spec is unknown or cannot be loaded, or arguments were given to an agent that takes none;
            the one-line message names it (``field="--agent"``).
    """
    spec = spec.strip()
    kwargs = dict(agent_args or {})
    if spec == "chat":
        return _chat(kwargs)
    if kwargs and (spec == "oracle" or spec.startswith(("script:", "cmd:"))):
        raise _error(spec, f"takes no --agent-arg (got {', '.join(sorted(kwargs))})")
    if spec == "oracle":
        return AgentSpec("oracle", _oracle)
    if spec.startswith("script:"):
        target = spec[len("script:"):]
        if not target:
            raise _error(spec, "script: needs a FILE")
        return _script(spec, target)
    if spec.startswith("cmd:"):
        return _command(spec, spec[len("cmd:"):])
    match = _MODULE_CLASS.match(spec)
    if match:
        return _module(spec, match["module"], match["cls"], kwargs)
    raise _error(spec, "unknown agent")
