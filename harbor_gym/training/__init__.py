"""Training records: what a trainer trains on, from harbor_gym's episodes, as plain data (SPEC GYM-13).

`episode_samples` turns an `EpisodeResult` into `TrainingSample`s (prompt ids, completion ids, loss mask,
logprobs, the episode reward and every turn's reward with its token span) in one of the `LAYOUTS`. This layer
sits above `harbor_gym.run` and below `harbor_gym.integrations` (the trainer adapters), and knows no trainer.
"""

from harbor_gym.training._record import (
    LAYOUTS,
    CallRef,
    EpisodeSamples,
    LayoutError,
    TrainingSample,
    TurnSpan,
    episode_samples,
    episode_trainable,
    rollout_samples,
    token_rewards,
)

__all__ = ["LAYOUTS", "CallRef", "EpisodeSamples", "LayoutError", "TrainingSample", "TurnSpan",
           "episode_samples", "episode_trainable", "rollout_samples", "token_rewards"]
