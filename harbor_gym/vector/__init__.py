"""harbor_gym.vector: Harbor envs as one ``gymnasium.vector.VectorEnv``, built for containers.

`HarborVectorEnv` runs its sub-envs' turns concurrently in worker threads (``executor="thread"``) or in Ray actors
spread over a cluster (``executor="ray"``, extra ``harbor_gym[ray]``), with warm sandbox pools so that resets do not
wait on container starts. It is the ``vector_entry_point`` of every registered id:
``gymnasium.make_vec("harbor_gym/cake-v0", num_envs=8, vectorization_mode="vector_entry_point")``.
`prewarm` fills this process's warm pools for every task of a folder ahead of a loop.
"""

from harbor_gym.vector._prewarm import PrewarmResult, prewarm
from harbor_gym.vector._vector_env import EXECUTORS, HarborVectorEnv

__all__ = ["HarborVectorEnv", "EXECUTORS", "prewarm", "PrewarmResult"]
