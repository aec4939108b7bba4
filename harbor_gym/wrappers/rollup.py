"""`RewardRollup`: pay the episode's roll-up (mean or final, SPEC RWD-7/8) instead of, or beside, turn rewards."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from harbor_gym.errors import ConfigError

__all__ = ["RewardRollup", "ROLLUP_MODES"]

#: ``info``: turn rewards untouched, the roll-up in ``info["rollup"]`` at the end; ``sparse``: 0 until the last
#: turn, then the roll-up; ``telescoping``: dense rewards whose sum equals the roll-up.
ROLLUP_MODES = ("info", "sparse", "telescoping")
_PREP_FAILURES = ("harbor:step_setup_failed", "harbor:step_workdir_failed", "harbor:step_healthcheck_failed")


def _score_of(record):
    """The roll-up input of a turn record (RWD-6: measured 0s; DIFF-1/2 decide under Harbor)."""
    from harbor_gym.episode._rollup import ScoreKind, TurnScore

    if record.masked:
        return TurnScore(ScoreKind.MASKED)
    if record.reward_valid:
        return TurnScore(ScoreKind.VERIFIED, dict(record.verifier_rewards))
    if record.failure_kind in _PREP_FAILURES:
        return TurnScore(ScoreKind.PREP_FAILED)
    return TurnScore(ScoreKind.NO_RESULT)


class RewardRollup(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Turn the per-turn rewards of a harbor_gym env into its episode roll-up.

    Args:
        env: a harbor_gym env (or a wrapper of one).
        strategy: ``None`` (the task's ``multi_step_reward_strategy``, as the engine rolls up), ``"mean"`` or
            ``"final"`` (recomputed from the turns with the engine's own roll-up rules, RWD-6..9, DIFF-1..3).
        mode: one of `ROLLUP_MODES`.

    A masked or ungraded episode (roll-up ``None``) pays 0 and says so: ``info["rollup"]`` on the ending call holds
    ``reward`` (the roll-up or ``None``), ``paid`` (what this wrapper paid in total), ``strategy``, ``masked`` and
    ``graded``.
    """

    def __init__(self, env: gym.Env, strategy: str | None = None, mode: str = "info"):
        if strategy not in (None, "mean", "final"):
            raise ConfigError(f"strategy must be None, 'mean' or 'final', got {strategy!r}", field="strategy")
        if mode not in ROLLUP_MODES:
            raise ConfigError(f"mode must be one of {ROLLUP_MODES}, got {mode!r}", field="mode")
        gym.utils.RecordConstructorArgs.__init__(self, strategy=strategy, mode=mode)
        gym.Wrapper.__init__(self, env)
        self.strategy = strategy
        self.mode = mode
        self._scores: list = []
        self._paid = 0.0

    def reset(self, **kwargs):
        self._scores = []
        self._paid = 0.0
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        record = info.get("turn")
        if record is not None:
            self._scores.append(_score_of(record))
        result = info.get("episode_result")
        if result is not None:
            rollup = self._final_rollup(result)
            paid = self._pay_final(float(reward), rollup)
            info = {**info, "rollup": {
                "reward": rollup,
                "paid": self._paid,
                "strategy": self.strategy or result.strategy,
                "masked": bool(result.masked),
                "graded": bool(result.graded),
            }}
            return obs, paid, terminated, truncated, info
        return obs, self._pay_running(float(reward)), terminated, truncated, info

    def _harbor(self) -> bool:
        return getattr(self.env.unwrapped.config.semantics, "value", "seed") == "harbor"

    def _running_rollup(self) -> float:
        from harbor_gym.episode._rollup import roll_up

        strategy = self.strategy or getattr(self.env.unwrapped, "task").config.multi_step_reward_strategy or "mean"
        value = roll_up(self._scores, getattr(strategy, "value", strategy), harbor=self._harbor()).reward
        return float(value) if value is not None else 0.0

    def _final_rollup(self, result) -> float | None:
        if not result.graded or result.masked:
            return None
        if self.strategy is None or self.strategy == result.strategy:
            return result.reward
        from harbor_gym.episode._rollup import roll_up

        return roll_up(self._scores, self.strategy, harbor=self._harbor()).reward

    def _pay_running(self, reward: float) -> float:
        if self.mode == "info":
            pay = reward
        elif self.mode == "sparse":
            pay = 0.0
        else:
            pay = self._running_rollup() - self._paid
        self._paid += pay
        return pay

    def _pay_final(self, reward: float, rollup: float | None) -> float:
        if self.mode == "info":
            pay = reward
        else:
            # sparse pays everything now; telescoping pays the rest, so that the sum equals the roll-up (0 if None).
            pay = (rollup if rollup is not None else 0.0) - (self._paid if self.mode == "telescoping" else 0.0)
        self._paid += pay
        return pay
