"""`rollouts` (exported as ``harbor_gym.rollouts``): the non-lock-step rollout collector (issue 15) — K rollouts of every task, C episodes in flight,
each result yielded the moment its episode ends; `collect` is its sync form.

Guarantees:
- Each episode gets its own agent from ``agent(task_id, rollout, seed)`` (the factory) and runs through
  `HarborEnv` (``areset``, then one ``astep`` per turn): rewards, records and rules are the env's.
- At most ``concurrency`` episodes are in flight; their sandbox work runs on a pool of ``concurrency`` threads
  the collector owns (never asyncio's default executor), async agents on the caller's loop. No new episode starts
  while the consumer holds a result (back-pressure): a slow consumer never piles up finished episodes.
- Every ``(task, rollout)`` is yielded exactly once, as a `RolloutResult`, whether it was graded, ungraded, refused
  at seed or its env raised: failures are yielded, never raised. Only the last attempt is yielded.
- Retries: a retryable failure (outage, deadline, ``SeedError(retryable=True)``, agent ``retry``) is retried up to
  ``retries`` times; an agent-caused outage (GYM-12) only under ``config.retry_agent_outages``.
- Seeds: rollout k of task t gets ``episode_seed(seed, t, k)`` (the same as ``harbor-gym run``), so threads and Ray
  (``executor="ray"``: each episode is a Ray task with ``num_cpus=0`` running the sync env in a worker process)
  give the same results for the same seeds and agents.
- Ray placement (issue 17 item 3): each episode task asks for ``{"harbor_engine": 1}`` (`ray_options` overrides
  it), so Ray runs it only on a node declaring that custom resource, and its sandboxes use that node's engine (the
  ``DOCKER_HOST`` of its raylet; `harbor_gym.vector._placement`). No node offering it within
  ``ray_placement_timeout_s`` raises `SandboxUnavailableError` before anything runs; every node offering it gone
  for that long while episodes wait ends those episodes with that error as their (retryable) failure.
- A Ray node lost mid-episode (``NodeDiedError``, a crashed worker) ends that episode as a retryable
  ``harbor_gym:sandbox_outage`` whose reason names the node (id and IP, as Ray reports them); it is retried like
  any retryable failure (``retries``), as a new task Ray places on a live node. Its sandboxes are removed by their
  leases (the reaper on that node's engine, within ``lease_ttl_s`` + 20 s).
- Closing the iterator early (``break``, ``aclose``, cancellation, Ctrl-C under ``asyncio.run``) cancels the
  episodes in flight: their sandboxes are stopped before the iterator's close returns; they yield nothing.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError, HarborGymError, SeedError, SeedRefusedError
from harbor_gym.run.rows import ENV_ERROR, SEED_FAILED, SEED_REFUSED, episode_seed
from harbor_gym.vector._placement import ENGINE_DEMAND, PLACEMENT_TIMEOUT_S, demand_of, offered, unplaced_error

__all__ = ["RolloutResult", "rollouts", "collect", "EXECUTORS"]

#: Where episodes run: threads of this process, or Ray tasks.
EXECUTORS = ("threads", "ray")


@dataclass(frozen=True)
class RolloutResult:
    """One finished episode of the collector (the last attempt of one ``(task_id, rollout)``).

    Attributes:
        task_id, rollout, seed, attempt: which episode (``attempt`` is 1-based).
        reward: the episode reward when graded; 0.0 for an agent-caused outage (GYM-12); else ``None``.
        graded: the episode was graded (not masked).
        agent_caused: the episode ended in an outage the agent caused (GYM-12).
        episode: the `EpisodeResult` (turns, outcomes, model calls); ``None`` when no episode ran to its end
            (refused or failed at seed, or the env raised).
        failure_kind: the episode's failure kind, or ``harbor_gym:seed_refused`` / ``seed_failed`` / ``env_error``.
        reason: one line saying why, when it failed.
        retryable: the (last) failure was retryable.
        duration_sec: wall-clock seconds of the last attempt.
        turns: the TurnRecords of the last attempt as ``info["turn"]`` gave them.
    """

    task_id: str
    rollout: int
    seed: int
    attempt: int
    reward: float | None
    graded: bool
    agent_caused: bool
    episode: Any = None
    failure_kind: str | None = None
    reason: str | None = None
    retryable: bool = False
    duration_sec: float = 0.0
    turns: tuple = field(default=(), repr=False)


@dataclass
class _Job:
    task: Any
    rollout: int
    seed: int


@dataclass
class _Context:
    factory: Callable[..., Any]
    config: EnvConfig
    retries: int
    sandbox_factory: Callable | None
    logs_dir: Callable[[str, int], Any] | None
    listener: Any
    pool: ThreadPoolExecutor | None = None
    ray_options: dict = field(default_factory=dict)  # the options of every episode task (executor="ray")
    placement_timeout_s: float = PLACEMENT_TIMEOUT_S
    removals: list = field(default_factory=list)  # pool factories whose handed-out sandboxes are awaited at the end


def _agent_parts(agent: Any) -> tuple[Any, Callable[[str], Any]]:
    """``(announced agent, step_name -> action)``: an object with ``announced``/``action_for`` (the CLI's
    `EpisodeAgent`) is used as is; anything else is the action of every turn."""
    if hasattr(agent, "announced") and callable(getattr(agent, "action_for", None)):
        return agent.announced, agent.action_for
    return agent, lambda _step: agent


def _config_for(ctx: _Context, job: _Job) -> EnvConfig:
    if ctx.logs_dir is None:
        return ctx.config
    return ctx.config.replace(logs_root=str(ctx.logs_dir(job.task.id, job.rollout)))


def _failed(job: _Job, attempt: int, kind: str, reason: str, retryable: bool, t0: float) -> RolloutResult:
    return RolloutResult(task_id=job.task.id, rollout=job.rollout, seed=job.seed, attempt=attempt, reward=None,
                         graded=False, agent_caused=False, failure_kind=kind, reason=reason, retryable=retryable,
                         duration_sec=time.monotonic() - t0)


def _finished(job: _Job, attempt: int, episode: Any, records: list, t0: float) -> RolloutResult:
    graded = bool(episode.graded and not episode.masked and episode.reward is not None)
    agent_caused = bool(getattr(episode, "agent_caused", False))
    reward = float(episode.reward) if graded else (0.0 if agent_caused else None)
    reason = None
    if not graded:
        reason = getattr(episode, "failure_message", None) or (episode.failure_kind or
                                                               ("masked" if episode.masked else "ungraded"))
    return RolloutResult(task_id=job.task.id, rollout=job.rollout, seed=job.seed, attempt=attempt, reward=reward,
                         graded=graded, agent_caused=agent_caused, episode=episode,
                         failure_kind=episode.failure_kind, reason=reason,
                         retryable=bool(episode.retryable) and not graded, duration_sec=time.monotonic() - t0,
                         turns=tuple(records))


def _env_error(job: _Job, attempt: int, exc: Exception, t0: float) -> RolloutResult:
    retryable = bool(getattr(exc, "retryable", False)) if isinstance(exc, HarborGymError) else False
    return _failed(job, attempt, ENV_ERROR, f"{type(exc).__name__}: {exc}", retryable, t0)


def _retries(result: RolloutResult, config: EnvConfig) -> bool:
    """A retryable failure is retried; an agent-caused outage only under ``retry_agent_outages`` (GYM-12)."""
    return not result.graded and result.retryable and (not result.agent_caused or config.retry_agent_outages)


# --- one attempt, async (threads) --------------------------------------------------------------------------
async def _attempt_async(job: _Job, attempt: int, ctx: _Context) -> RolloutResult:
    from harbor_gym.env import HarborEnv

    t0 = time.monotonic()
    env = None
    try:
        announced, action_for = _agent_parts(ctx.factory(job.task.id, job.rollout, job.seed))
        env = HarborEnv(job.task, config=_config_for(ctx, job), agent=announced,
                        sandbox_factory=ctx.sandbox_factory, executor=ctx.pool)
        try:
            obs, _ = await env.areset(seed=job.seed, options={"rollout": job.rollout})
        except SeedRefusedError as exc:
            return _failed(job, attempt, SEED_REFUSED, str(exc), False, t0)
        except SeedError as exc:
            return _failed(job, attempt, SEED_FAILED, str(exc), bool(exc.retryable), t0)
        records: list = []
        while True:
            obs, _, _, _, info = await env.astep(action_for(obs["step_name"]))
            records.append(info["turn"])
            if "episode_result" in info:
                return _finished(job, attempt, info["episode_result"], records, t0)
    except Exception as exc:  # the episode boundary: the env's or the agent's fault becomes a yielded result
        return _env_error(job, attempt, exc, t0)
    finally:
        if env is not None:
            await _close_env(env, ctx)


async def _close_env(env: Any, ctx: _Context) -> None:
    """Close ``env``; a pooled sandbox's removal is awaited once, at the collector's end (`_wait_removed`)."""
    loop = asyncio.get_running_loop()
    factory = env._sandbox_factory or env._own_pool_factory
    later = callable(getattr(factory, "wait_removed", None))
    try:
        await asyncio.shield(loop.run_in_executor(ctx.pool, lambda: env.close(wait_removed=not later)))
        if later and factory is not None:
            factory = env._sandbox_factory or env._own_pool_factory
            ctx.removals.append(factory)
    except asyncio.CancelledError:
        raise
    except Exception:  # a dead engine: the sandboxes are the reaper's now
        pass


async def _episode_threads(job: _Job, ctx: _Context) -> RolloutResult:
    attempts = ctx.retries + 1
    for attempt in range(1, attempts + 1):
        result = await _attempt_async(job, attempt, ctx)
        if attempt < attempts and _retries(result, ctx.config):
            _notify(ctx.listener, "episode_retry", job.task.id, job.rollout, attempt, result.reason or "")
            continue
        break
    return result


# --- one episode, sync (Ray tasks) -------------------------------------------------------------------------
def _attempt_sync(job: _Job, attempt: int, ctx: _Context) -> RolloutResult:
    from harbor_gym.env import HarborEnv

    t0 = time.monotonic()
    env = None
    try:
        announced, action_for = _agent_parts(ctx.factory(job.task.id, job.rollout, job.seed))
        env = HarborEnv(job.task, config=_config_for(ctx, job), agent=announced,
                        sandbox_factory=ctx.sandbox_factory)
        try:
            obs, _ = env.reset(seed=job.seed, options={"rollout": job.rollout})
        except SeedRefusedError as exc:
            return _failed(job, attempt, SEED_REFUSED, str(exc), False, t0)
        except SeedError as exc:
            return _failed(job, attempt, SEED_FAILED, str(exc), bool(exc.retryable), t0)
        records: list = []
        while True:
            obs, _, _, _, info = env.step(action_for(obs["step_name"]))
            records.append(info["turn"])
            if "episode_result" in info:
                return _finished(job, attempt, info["episode_result"], records, t0)
    except Exception as exc:  # the episode boundary
        return _env_error(job, attempt, exc, t0)
    finally:
        if env is not None:
            env.close()


def _episode_sync(job: _Job, ctx: _Context, first: int = 1) -> RolloutResult:
    attempts = ctx.retries + 1
    for attempt in range(first, attempts + 1):
        result = _attempt_sync(job, attempt, ctx)
        if attempt < attempts and _retries(result, ctx.config):
            continue
        break
    return result


def _ray_episode(task_path: str, rollout: int, seed: int, ctx: _Context, first: int) -> RolloutResult:
    """Runs in a Ray worker: the task is loaded there from its folder (plain data crosses, not sandboxes)."""
    from harbor_gym.task import load_task

    task = load_task(Path(task_path), ctx.config)
    return _episode_sync(_Job(task, rollout, seed), ctx, first)


#: `RolloutResult.failure_kind` of an episode lost with its Ray node (an outage, SPEC STOP-8).
_OUTAGE_KIND = "harbor_gym:sandbox_outage"
#: How often a waiting episode checks that some live node still offers the tasks' resources.
_OFFER_POLL_S = 2.0


async def _episode_ray(job: _Job, ctx: _Context) -> RolloutResult:
    """One episode as Ray tasks: a task lost with its node (or worker) is retried as a new task while attempts
    remain; the last loss is yielded as an outage naming the node."""
    attempts = ctx.retries + 1
    attempt = 1
    while True:
        result = await _ray_attempt(job, ctx, attempt)
        if result.failure_kind != _OUTAGE_KIND or result.episode is not None or attempt >= attempts \
                or not result.retryable:
            return result
        _notify(ctx.listener, "episode_retry", job.task.id, job.rollout, attempt, result.reason or "")
        attempt += 1


async def _ray_attempt(job: _Job, ctx: _Context, first: int) -> RolloutResult:
    import ray

    t0 = time.monotonic()
    remote = ray.remote(_ray_episode).options(**ctx.ray_options)
    plain = _Context(factory=ctx.factory, config=ctx.config, retries=ctx.retries, sandbox_factory=None,
                     logs_dir=ctx.logs_dir, listener=None)
    ref = remote.remote(str(job.task.path), job.rollout, job.seed, plain, first)
    demand = demand_of(ctx.ray_options)
    unoffered_since: float | None = None
    future = asyncio.wrap_future(ref.future())  # awaited across polls (asyncio.wait never cancels it)
    try:
        while True:
            done, _ = await asyncio.wait([future], timeout=_OFFER_POLL_S)
            if done:
                return future.result()
            # Still waiting (queued, or running): if no live node offers the demand any more, it never will run.
            if all(have >= demand[name] for name, have in offered(ray, demand).items()):
                unoffered_since = None
            elif unoffered_since is None:
                unoffered_since = time.monotonic()
            elif time.monotonic() - unoffered_since >= ctx.placement_timeout_s:
                ray.cancel(ref, force=True)
                err = unplaced_error(ray, demand, timeout_s=ctx.placement_timeout_s, what="a collector episode")
                return _failed(job, first, ENV_ERROR, f"SandboxUnavailableError: {err}", True, t0)
    except asyncio.CancelledError:
        ray.cancel(ref, force=True)  # the worker process dies; its sandboxes' leases lapse (GYM-10 reaper)
        raise
    except ray.exceptions.RayTaskError as exc:  # the task itself raised (a defect, a task that no longer loads)
        return _failed(job, first, ENV_ERROR, f"ray: {type(exc).__name__}: {exc}", False, t0)
    except Exception as exc:  # the node or worker was lost: an outage of this episode, naming the node
        return RolloutResult(task_id=job.task.id, rollout=job.rollout, seed=job.seed, attempt=first, reward=None,
                             graded=False, agent_caused=False, failure_kind=_OUTAGE_KIND,
                             reason=f"ray: {type(exc).__name__}: {exc}", retryable=True,
                             duration_sec=time.monotonic() - t0)


# --- the collector -----------------------------------------------------------------------------------------
def _notify(listener: Any, event: str, *args: Any) -> None:
    method = getattr(listener, event, None) if listener is not None else None
    if callable(method):
        method(*args)


def _tasks(path_or_dataset: Any, config: EnvConfig) -> list:
    """The tasks to run: a `Task`, a `Dataset`, a mapping of tasks, or a path (a task folder, a folder of task
    folders, a dataset name) loaded as ``harbor-gym run`` loads it; tasks that fail to load are skipped."""
    from harbor_gym.task import Dataset, Task

    if isinstance(path_or_dataset, Task):
        return [path_or_dataset]
    if isinstance(path_or_dataset, Dataset):
        return [path_or_dataset.tasks[k] for k in sorted(path_or_dataset.tasks)]
    if isinstance(path_or_dataset, Mapping):
        return [path_or_dataset[k] for k in sorted(path_or_dataset)]
    from harbor_gym.run.targets import load_targets

    return list(load_targets(path_or_dataset, config).tasks.values())


async def rollouts(
    path_or_dataset: Any,
    agent: Callable[[str, int, int], Any],
    *,
    rollouts_per_task: int = 1,
    concurrency: int = 1,
    config: EnvConfig | Mapping[str, Any] | None = None,
    executor: str = "threads",
    seed: int = 0,
    retries: int = 2,
    sandbox_factory: Callable | None = None,
    skip: Iterable[tuple[str, int]] = (),
    logs_dir: Callable[[str, int], Any] | None = None,
    listener: Any = None,
    ray_options: Mapping[str, Any] | None = None,
    ray_placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
) -> AsyncIterator[RolloutResult]:
    """Run ``rollouts_per_task`` episodes of every task, ``concurrency`` at a time, yielding each `RolloutResult`
    as soon as its episode ends (see the module docstring for the guarantees).

    Args:
        path_or_dataset: a task folder, a folder of task folders, a dataset name, a `Task` or a `Dataset`.
        agent: ``factory(task_id, rollout, seed) -> agent``; the agent (a ``str`` script, ``Oracle()``, an object
            with ``run(turn)`` or ``async def run(turn)``) is announced at reset and is the action of every turn.
        rollouts_per_task: K >= 1. concurrency: C >= 1 episodes in flight. retries: R >= 0 per episode.
        config: `EnvConfig` or ``dict`` of every env. executor: ``"threads"`` (default) or ``"ray"``.
        seed: the base seed of `harbor_gym.run.rows.episode_seed`.
        sandbox_factory: given to every env (threads only). skip: ``(task_id, rollout)`` pairs not to run.
        logs_dir: ``(task_id, rollout) -> folder`` of that episode's logs (``config.logs_root``).
        listener: optional object with ``episode_started(task_id, rollout)`` and ``episode_retry(task_id,
            rollout, attempt, reason)`` (``episode_retry`` also for Ray episodes lost with their node), called on
            the loop.
        ray_options: ``executor="ray"``: options of every episode task, each key replacing the default's
            (``num_cpus=0``, ``max_retries=0``, ``resources={"harbor_engine": 1}``; ``{"resources": {}}`` runs
            episodes on any node).
        ray_placement_timeout_s: ``executor="ray"``: how long the cluster may lack a node offering the tasks'
            resources (at the start, and while episodes wait) before `SandboxUnavailableError` (default 60 s).

    Raises:
        ConfigError: K, C < 1, R < 0 or an unknown executor (before anything runs).
        SandboxUnavailableError: ``executor="ray"`` and no live node offers the tasks' resources (``harbor_engine``)
            within ``ray_placement_timeout_s`` (before anything runs).
    """
    cfg = EnvConfig.coerce(dict(config) if isinstance(config, Mapping) else config)
    if rollouts_per_task < 1:
        raise ConfigError(f"must be >= 1, got {rollouts_per_task}", field="rollouts_per_task")
    if concurrency < 1:
        raise ConfigError(f"must be >= 1, got {concurrency}", field="concurrency")
    if retries < 0:
        raise ConfigError(f"must be >= 0, got {retries}", field="retries")
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}", field="executor")
    skipped = set(skip)
    jobs = iter([_Job(task, k, episode_seed(seed, task.id, k))
                 for k in range(rollouts_per_task) for task in _tasks(path_or_dataset, cfg)
                 if (task.id, k) not in skipped])
    ctx = _Context(factory=agent, config=cfg, retries=retries, sandbox_factory=sandbox_factory,
                   logs_dir=logs_dir, listener=listener)
    run_one = _episode_threads
    if executor == "ray":
        from harbor_gym.vector._placement import ensure_ray, wait_offered

        ray = ensure_ray(concurrency)
        ctx.ray_options = {"num_cpus": 0, "max_retries": 0, "resources": dict(ENGINE_DEMAND),
                           **dict(ray_options or {})}
        ctx.placement_timeout_s = float(ray_placement_timeout_s)
        await asyncio.get_running_loop().run_in_executor(None, lambda: wait_offered(
            ray, demand_of(ctx.ray_options), timeout_s=ctx.placement_timeout_s, what="the collector's episodes"))
        run_one = _episode_ray
    else:
        ctx.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="harbor-gym-rollouts")
    pending: set[asyncio.Task] = set()
    try:
        while True:
            while len(pending) < concurrency:
                job = next(jobs, None)
                if job is None:
                    break
                _notify(listener, "episode_started", job.task.id, job.rollout)
                pending.add(asyncio.ensure_future(run_one(job, ctx)))
            if not pending:
                return
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for finished in sorted(done, key=lambda t: id(t)):
                yield finished.result()  # the consumer holds it: no new episode starts meanwhile
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await _wait_removed(ctx)
        if ctx.pool is not None:
            ctx.pool.shutdown(wait=False)


async def _wait_removed(ctx: _Context) -> None:
    """Every pooled sandbox the collector's episodes used is removed before the iterator's close returns."""
    factories = list({id(f): f for f in ctx.removals}.values())
    ctx.removals.clear()
    if not factories:
        return
    loop = asyncio.get_running_loop()

    def wait_all() -> None:
        for factory in factories:
            factory.wait_removed(60.0)

    await asyncio.shield(loop.run_in_executor(ctx.pool, wait_all))


def collect(path_or_dataset: Any, agent: Callable[[str, int, int], Any], **kwargs: Any) -> list[RolloutResult]:
    """`rollouts` run to the end in a fresh event loop: the list of every `RolloutResult`, in order of finishing.
    Same arguments; must not be called from a running event loop (use ``rollouts`` there)."""

    async def gather() -> list[RolloutResult]:
        return [result async for result in rollouts(path_or_dataset, agent, **kwargs)]

    return asyncio.run(gather())
