"""`ContinueSession`: one harness session across the turns of an episode (SPEC SES-1/3/4), with turn history."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from harbor_gym.errors import ConfigError
from harbor_gym.spaces import MAX_TEXT_LENGTH, UnicodeText

__all__ = ["ContinueSession"]


def _history_entry_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "instruction": UnicodeText(MAX_TEXT_LENGTH),
            "action": UnicodeText(MAX_TEXT_LENGTH),
            "output_tail": UnicodeText(MAX_TEXT_LENGTH),
            "reward": spaces.Box(low=-np.inf, high=np.inf, shape=(), dtype=np.float64),
        }
    )


def _describe_action(action: Any) -> str:
    if isinstance(action, str):
        return action
    name = getattr(action, "name", None)
    return name if isinstance(name, str) and name else type(action).__name__


def _text(value: Any) -> str:
    """A history text entry within the space's bound (the end is kept, as in ``output_tail``)."""
    text = value if isinstance(value, str) else ""
    return text if len(text) <= MAX_TEXT_LENGTH else text[-MAX_TEXT_LENGTH:]


class ContinueSession(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Run the env with ``turn_sessions="continue"`` and add the earlier turns to each observation.

    The engine then keeps one harness session per episode (SES-3): every turn's action must be the same agent
    object (else ``SessionMismatchError``, a ``ValueError``, with no side effect), and that agent must declare
    ``supports_continue`` and be announced at ``reset`` (``options={"agent": a}`` or the env's ``agent``), so that
    LOAD-22 refuses it before any sandbox starts (GYM-4).

    The observation gains ``history``: a tuple, one entry per earlier turn of the episode, each with the
    ``instruction`` it received, the ``action`` (a script's text, else the agent's name), the agent's ``output_tail``
    and the turn's ``reward`` (a 0-d ``float64`` array, as its ``Box`` space wants); every observation, ``history``
    included, is in ``observation_space``. A step refused with ``SessionMismatchError`` adds no entry.

    Raises:
        ConfigError: ``env`` is not a harbor_gym env (it has no ``config`` with ``replace``).
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        base = env.unwrapped
        if not hasattr(base, "config") or not hasattr(base.config, "replace"):
            raise ConfigError("ContinueSession wraps a harbor_gym env", field="env")
        base.config = base.config.replace(turn_sessions="continue")
        self.observation_space = spaces.Dict(
            {**env.observation_space.spaces, "history": spaces.Sequence(_history_entry_space(), stack=False)}
        )
        self._history: list[dict[str, Any]] = []
        self._last_instruction = ""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._history = []
        self._last_instruction = obs.get("instruction", "")
        return self._with_history(obs), info

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = info.get("turn")
        self._history.append(
            {
                "instruction": _text(record.instruction if record is not None else self._last_instruction),
                "action": _text(_describe_action(action)),
                "output_tail": _text(record.output_tail if record is not None else ""),
                "reward": np.array(reward, dtype=np.float64),
            }
        )
        self._last_instruction = obs.get("instruction", "")
        return self._with_history(obs), reward, terminated, truncated, info

    def _with_history(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {**obs, "history": tuple({**entry, "reward": entry["reward"].copy()} for entry in self._history)}
