"""Sub-env handles of `HarborVectorEnv`: one interface (``reset``, ``step``, ``close``) over an env in this process
or in a Ray actor, and the conversion of infos to plain data and back (only plain data crosses a process).

A handle's calls may raise; the vector env turns any raise into that sub-env's ``truncated`` (SPEC GYM-2).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from harbor_gym.config import EnvConfig

__all__ = ["SubEnv", "LocalSubEnv", "EnvRecipe", "info_to_plain", "info_from_plain"]


class SubEnv(Protocol):
    """What the vector env needs of one sub-env."""

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[dict, dict]: ...

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class EnvRecipe:
    """How to build one sub-env anywhere (plain data, or a picklable ``env_fn``).

    Attributes:
        path: a task folder or a folder of task folders (``None`` when ``env_fn`` is given).
        config: the env's config as a JSON-able dict.
        env_fn: a picklable callable building the env (overrides ``path``); used as given.
        use_pool: build the env with the process's warm pools (`harbor_gym.sandbox.pool.pool_factory`).
    """

    path: str | None = None
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env_fn: Callable[[], Any] | None = None
    use_pool: bool = True

    def build(self) -> Any:
        """The env (a `HarborEnv`, `HarborDatasetEnv`, or whatever ``env_fn`` returns)."""
        if self.env_fn is not None:
            return self.env_fn()
        from harbor_gym.env import HarborDatasetEnv, HarborEnv

        config = EnvConfig.coerce(dict(self.config))
        factory = None
        if self.use_pool:
            from harbor_gym.sandbox.pool import pool_factory

            factory = pool_factory(config)
        path = Path(self.path)
        cls = HarborEnv if (path / "task.toml").is_file() else HarborDatasetEnv
        return cls(path, config=config, sandbox_factory=factory)


class LocalSubEnv:
    """A sub-env living in this process (its calls run in the vector env's worker threads)."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[dict, dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


# --- plain data across processes ---------------------------------------------------------------------------
_RECORD_KEYS = ("turn", "episode_result")


def info_to_plain(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` with its `TurnRecord`/`EpisodeResult` as tagged dicts (JSON-able data only)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in _RECORD_KEYS and hasattr(value, "to_dict"):
            out[key] = {"__record__": type(value).__name__, "data": value.to_dict()}
        elif isinstance(value, Mapping):
            out[key] = info_to_plain(value)
        else:
            out[key] = value
    return out


def info_from_plain(info: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `info_to_plain`: tagged dicts become frozen `TurnRecord`/`EpisodeResult` again."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, Mapping) and "__record__" in value:
            out[key] = _record(value["__record__"], value["data"])
        elif isinstance(value, Mapping):
            out[key] = info_from_plain(value)
        else:
            out[key] = value
    return out


def _record(kind: str, data: Mapping[str, Any]) -> Any:
    from harbor_gym.episode._records import EpisodeResult, ManifestEntry, TurnRecord

    def turn(d: Mapping[str, Any]) -> TurnRecord:
        d = dict(d)
        d["manifest"] = tuple(ManifestEntry(**{**m, "exclude": tuple(m.get("exclude", ()))})
                              for m in d.get("manifest", ()))
        return TurnRecord(**d)

    if kind == "TurnRecord":
        return turn(data)
    if kind == "EpisodeResult":
        d = dict(data)
        d["turns"] = tuple(turn(t) for t in d.get("turns", ()))
        return EpisodeResult(**d)
    return dict(data)
