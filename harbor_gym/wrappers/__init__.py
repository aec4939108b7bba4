"""harbor_gym.wrappers: Gymnasium wrappers over harbor_gym envs (they never reach into the sandbox)."""

from harbor_gym.wrappers.record import RecordRollouts
from harbor_gym.wrappers.rollup import ROLLUP_MODES, RewardRollup
from harbor_gym.wrappers.session import ContinueSession

__all__ = ["RewardRollup", "ContinueSession", "RecordRollouts", "ROLLUP_MODES"]
