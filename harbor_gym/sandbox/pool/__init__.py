"""Warm pools: pristine sandboxes started ahead of need, so that ``reset`` does not wait on a container start.

One `SandboxPool` per (spec, backend, settings). It keeps up to ``size`` sandboxes started and never used
("pristine"), refills in a background thread (at most `MAX_CONCURRENT_STARTS` background starts at a time, process
wide), and tears handed-out sandboxes down in a background reaper, so that neither the start nor the teardown sits
on the reset path.

Guarantees:
- A sandbox is handed out at most once and never returns to the pool: `PooledSandbox.stop` retires it to the
  reaper (SPEC GYM-2: every episode starts on a sandbox no episode used).
- ``ready + starting <= size`` at all times (handed-out sandboxes are not the pool's any more).
- A ready sandbox is health-checked (``is_alive``, one engine request) before it is handed out; a dead one is
  discarded. When no ready sandbox is left, `SandboxPool.claim` starts one itself.
- Pool sandboxes are ordinary backend sandboxes: they hold the process lease (the engine's reaper removes what a
  SIGKILLed host left within ``lease_ttl_s`` + 20 s, GYM-10) and are registered for the interpreter-exit stop.
- `SandboxPool.close` (and `close_pools`, also run at interpreter exit) removes every sandbox the pool started:
  ready ones, ones still starting, and handed-out ones not yet torn down. It is idempotent.

- `PooledSandbox.wait_removed` / `PoolFactory.wait_removed` wait until retired sandboxes are really gone (what
  ``HarborEnv.close`` does, so that nothing of its episodes outlives it).

Use: ``EnvConfig(pool_size=N)`` (any env, `Episode`, the vector env, ``harbor-gym run``), or
``HarborEnv(path, sandbox_factory=pool_factory(config))``; ``harbor-gym prewarm PATH --size N`` fills pools ahead of a
run. The episode claims with `PoolFactory.claim_prepared`, so its seeding (GYM-2) runs ahead on the pool too.

Modules: `_pool` (the pool: claim, refill, reaper, close), `_pooled` (the handed-out wrapper), `_registry`
(the process's pools, `PoolFactory`, `pool_factory`). Import from here.
"""

from harbor_gym.sandbox.pool._pool import MAX_CONCURRENT_STARTS, PoolState, PoolStats, SandboxPool
from harbor_gym.sandbox.pool._pooled import PooledSandbox
from harbor_gym.sandbox.pool._registry import PoolFactory, close_pools, get_pool, pool_factory, pools

__all__ = [
    "SandboxPool",
    "PoolState",
    "PoolStats",
    "PooledSandbox",
    "PoolFactory",
    "MAX_CONCURRENT_STARTS",
    "get_pool",
    "pool_factory",
    "pools",
    "close_pools",
]
