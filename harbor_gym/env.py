"""`HarborEnv` and `HarborDatasetEnv`: a Harbor task folder (or a folder of them) as a ``gymnasium.Env``.

The env adapts an `Episode` (the turn engine) to Gymnasium and adds nothing to Harbor's semantics: ``reset`` starts
a pristine episode (SPEC GYM-2), ``step`` runs exactly one turn (GYM-6), ``close`` stops every sandbox (GYM-7).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError, ResetNeededError, TaskLoadError
from harbor_gym.spaces import MAX_TURNS, ScriptSpace, observation_space

__all__ = ["HarborEnv", "HarborDatasetEnv", "EnvState", "CANCELLED_KIND", "async_executor"]

#: ``failure_kind`` of an episode whose ``astep``/``areset`` was cancelled (issue 15): truncated, ungraded, never
#: agent-caused, retryable.
CANCELLED_KIND = "harbor_gym:cancelled"
#: How long a cancelled ``astep`` waits for its turn's thread once the episode's sandboxes were stopped.
_CANCEL_WAIT_S = 60.0

_executors: dict[int, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def async_executor(threads: int) -> ThreadPoolExecutor:
    """The process-wide pool of ``threads`` threads behind ``areset``/``astep`` of envs without their own
    ``executor`` (one pool per size, `EnvConfig.async_concurrency`). Never asyncio's default executor."""
    with _executors_lock:
        pool = _executors.get(threads)
        if pool is None:
            pool = _executors[threads] = ThreadPoolExecutor(max_workers=threads,
                                                            thread_name_prefix="harbor-gym-async")
        return pool


class EnvState(enum.Enum):
    """Lifecycle of an env: no episode yet, an episode running, the episode over, closed."""

    UNSTARTED = "unstarted"
    RUNNING = "running"
    OVER = "over"
    CLOSED = "closed"


def _as_task(task_or_path: Any, config: EnvConfig):
    """A loaded task, or the folder loaded under ``config`` (its semantics decide LOAD-6 and VER-4)."""
    from harbor_gym.task import Task, load_task

    if isinstance(task_or_path, Task):
        return task_or_path
    return load_task(Path(task_or_path), config)


def _as_config(config: EnvConfig | Mapping[str, Any] | None) -> EnvConfig:
    return EnvConfig.coerce(dict(config) if isinstance(config, Mapping) else config)


def _exactly_one(given: Any, path: Any, owner: str, name: str) -> Any:
    """The source an env was given: ``given`` (positional) or ``path`` (keyword, as the registered ids pass it)."""
    if (given is None) == (path is None):
        raise ConfigError(f"give exactly one of {name} and path", field=owner)
    return given if given is not None else path


def _check_render_mode(render_mode: str | None, allowed: list[str]) -> None:
    if render_mode not in (None, *allowed):
        raise ConfigError(f"render_mode must be None or one of {allowed}, got {render_mode!r}", field="render_mode")


def _check_turn_bound(task) -> None:
    if len(task.steps) > MAX_TURNS:
        raise TaskLoadError(
            f"{len(task.steps)} steps exceed the env's fixed bound of {MAX_TURNS} turns",
            path=task.path,
            field="steps",
            rule="GYM-3",
        )


class HarborEnv(gym.Env[dict, Any]):
    """One Harbor task folder as a Gymnasium env; each ``step`` is one turn (SPEC §1).

    Args:
        task_or_path: a loaded ``Task`` or the path of a task folder (loaded and validated now, GYM-1).
        config: an `EnvConfig` or a plain ``dict`` of its fields.
        agent: the agent announced for every episode (GYM-4); ``reset(options={"agent": a})`` overrides it.
        render_mode: ``None`` or ``"ansi"``.
        sandbox_factory: how sandboxes are made (default: ``harbor_gym.sandbox.open`` with ``config.backend``; with
            ``config.pool_size > 0``, the process's warm pools, see below).
        path: the task folder, as a keyword (the registered id ``harbor_gym/HarborTask-v0`` passes it so).
        executor: the threads that run ``areset``/``astep`` (default: the process-wide pool of
            ``config.async_concurrency`` threads, `async_executor`).

    Async (issue 15): ``await env.areset(...)`` and ``await env.astep(action)`` are ``reset``/``step`` with the
    sandbox work on a thread of ``executor``, so the event loop is never blocked; an agent may be async
    (``async def run(turn)`` with ``await turn.aexec(...)``): its coroutine runs on the caller's loop. Cancelling
    ``astep`` stops the turn's sandbox work (the episode's sandboxes are stopped and awaited), then ends the
    episode truncated: ``env.last_result.failure_kind == CANCELLED_KIND``, ungraded, never agent-caused; the
    ``CancelledError`` propagates. Cancelling ``areset`` stops what the seed started. One call at a time per env.

    Warm pools: with ``config.pool_size = N > 0`` and no ``sandbox_factory``, ``reset`` claims an agent sandbox that a
    process-wide pool (`harbor_gym.sandbox.pool`) started and seeded ahead (GYM-2), and the pool keeps N more
    pristine ones per sandbox spec. Those warm sandboxes belong to the pool, not to the env: they run (and hold the
    process lease) until `harbor_gym.sandbox.pool.close_pools` or interpreter exit removes them. ``close`` removes
    every sandbox this env's episodes used before it returns.

    Raises:
        TaskLoadError: the folder is refused (SPEC §3). No sandbox starts here.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        task_or_path: Any = None,
        config: EnvConfig | Mapping[str, Any] | None = None,
        agent: Any = None,
        render_mode: str | None = None,
        *,
        sandbox_factory: Callable | None = None,
        path: str | Path | None = None,
        executor: Executor | None = None,
    ) -> None:
        source = _exactly_one(task_or_path, path, "HarborEnv", "task_or_path")
        _check_render_mode(render_mode, self.metadata["render_modes"])
        self.task = _as_task(source, _as_config(config))
        _check_turn_bound(self.task)
        self._init_common(config, agent, render_mode, sandbox_factory, with_task_id=False, executor=executor)

    def _init_common(self, config, agent, render_mode, sandbox_factory, *, with_task_id: bool,
                     executor: Executor | None = None) -> None:
        self.config = _as_config(config)
        self.agent = agent
        self.render_mode = render_mode
        self.observation_space = observation_space(with_task_id=with_task_id)
        self.action_space = ScriptSpace()
        self._with_task_id = with_task_id
        self._sandbox_factory = sandbox_factory
        self._own_pool_factory = None  # made at the first reset when config.pool_size > 0 and no factory was given
        self._episode = None
        self._state = EnvState.UNSTARTED
        self._last_record = None
        self._last_result = None
        self._executor = executor
        self._bridges: dict = {}  # issue 15: one bridge per async agent object (SES-3 sees the same action)
        self._starting = None  # the episode being seeded (a cancelled areset stops it)
        self._loop = None  # the event loop of the running areset/astep (async agents run on it)

    @property
    def backend(self) -> str:
        """The sandbox backend this env's episodes use: ``"docker"`` or ``"local"``, ``auto`` decided as the
        sandboxes decide it (once per process: docker when an engine answers)."""
        from harbor_gym.sandbox import config_backend

        return config_backend(self.config)

    @property
    def last_result(self):
        """The `EpisodeResult` of the last episode that ended (``None`` before); after a cancelled ``astep``, the
        truncated result with ``failure_kind == CANCELLED_KIND``."""
        return self._last_result

    # --- Gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start a pristine episode: the previous one's sandboxes are stopped first (GYM-2).

        Options: ``agent`` (announces the agent, GYM-4), ``rollout`` (an int given to agents as ``turn.rollout``;
        ``turn.seed`` is ``seed``); for the dataset env also ``task`` (a task id).

        Raises:
            SeedRefusedError: LOAD-20..24, before any sandbox starts.
            SeedError: the seed healthcheck failed or the sandbox stayed out after its retries (retryable).
            ResetNeededError: the env is closed.
        """
        if self._state is EnvState.CLOSED:
            raise ResetNeededError("the env is closed; make a new one", field="reset", rule="GYM-7")
        super().reset(seed=seed)
        self.action_space.seed(int(self.np_random.integers(0, 2**31 - 1)))
        options = dict(options or {})
        agent = options.pop("agent", self.agent)
        rollout = options.pop("rollout", None)  # GYM-13: turn.rollout (the runner gives its rollout index)
        task = self._select_task(options)
        if options:
            raise ConfigError(f"unknown reset option(s): {', '.join(sorted(options))}", field="reset(options)")
        self._close_episode()
        from harbor_gym.agents._async import bridge_for

        self._bridges.clear()
        agent = bridge_for(agent, self._bridges, self._loop)
        from harbor_gym.episode import Episode

        episode = Episode(task, config=self.config, sandbox_factory=self._factory(), agent=agent, seed=seed,
                          rollout=rollout if rollout is None else int(rollout))
        self._starting = episode
        try:
            episode.start()
        except BaseException:
            episode.close()
            raise
        finally:
            self._starting = None
        self._episode = episode
        self._state = EnvState.RUNNING
        self._last_record = None
        self._last_result = None
        return self._observation(), {"task_id": task.id, "num_turns": len(task.steps)}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Run exactly one turn (GYM-6): ``action`` is a script, ``Oracle()`` or an agent object (GYM-4).

        Returns ``(obs, reward, terminated, truncated, info)`` with the turn reward as a Python ``float`` (0.0 for
        measured-0, masked and ungraded turns), ``info["turn"]`` the TurnRecord, and on the ending call
        ``info["episode_result"]``. An outage or a passed deadline is ``truncated=True`` (GYM-7, STOP-8, BUD-8),
        with ``info["cause"]`` the record's ``failure_message`` (one line naming the task, the step and the cause).
        ``info["agent_caused"]`` (bool) and ``info["outage_cause"]`` say whether the agent caused it (GYM-12).

        Raises:
            ResetNeededError: no episode is running (before ``reset`` or after its end; GYM-7).
        """
        if self._state is not EnvState.RUNNING or self._episode is None:
            raise ResetNeededError(
                "step() needs a running episode: call reset() first"
                if self._state is not EnvState.OVER
                else "the episode is over: call reset() to start a new one",
                field="step",
                rule="GYM-7",
            )
        from harbor_gym.agents._async import bridge_for

        result = self._episode.run_turn(bridge_for(action, self._bridges, self._loop))
        record = result.record
        self._last_record = record
        info: dict[str, Any] = {"turn": record}
        # GYM-12: an outage the agent caused (its sandbox died, ran out of memory, pids or storage, or it killed
        # the harness's processes) is flagged, with what happened; the turn's reward is then 0.0
        info["agent_caused"] = bool(getattr(record, "agent_caused", False))
        info["outage_cause"] = getattr(record, "outage_cause", None)
        terminated, truncated = bool(result.terminated), bool(result.truncated)
        if truncated:  # STOP-8, BUD-8: the cause in one line (task, step, what happened)
            info["cause"] = record.failure_message
        if result.episode is not None or terminated or truncated:
            self._last_result = result.episode if result.episode is not None else self._episode.result()
            info["episode_result"] = self._last_result
            self._state = EnvState.OVER
            # STOP-10: the episode's sandboxes stop with the episode, not at the next reset.
            self._close_episode()
        reward = record.reward if isinstance(record.reward, (int, float)) and not record.masked else 0.0
        return self._observation(), float(reward), terminated, truncated, info

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """``reset`` without blocking the event loop (issue 15): the seed runs on a thread of the env's executor.

        Cancelled: what the seed started is stopped and awaited, the env has no episode, ``CancelledError``
        propagates. Raises what ``reset`` raises."""
        return await self._off_loop(lambda: self.reset(seed=seed, options=options), stage="reset")

    async def astep(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """``step`` without blocking the event loop (issue 15): the turn runs on a thread of the env's executor;
        an async agent's coroutine runs on this loop and its ``turn.aexec`` calls on that thread.

        Cancelled: the turn's sandbox work is stopped (the episode's sandboxes are removed and the turn's thread
        awaited, at most 60 s), the agent's coroutine is cancelled, and the episode ends truncated with
        ``last_result.failure_kind == CANCELLED_KIND`` (ungraded, retryable, not agent-caused); then
        ``CancelledError`` propagates. Raises what ``step`` raises."""
        return await self._off_loop(lambda: self.step(action), stage="step")

    async def aclose(self) -> None:
        """``close`` without blocking the event loop: run on a thread of the env's executor."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor or async_executor(self.config.async_concurrency), self.close)

    async def _off_loop(self, call: Callable[[], Any], *, stage: str) -> Any:
        loop = asyncio.get_running_loop()
        self._loop = loop
        executor = self._executor or async_executor(self.config.async_concurrency)
        future = loop.run_in_executor(executor, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await self._cancel_inflight(future, stage)
            raise
        finally:
            self._loop = None

    async def _cancel_inflight(self, future: asyncio.Future, stage: str) -> None:
        """Stop the running reset/turn: cancel async agents, stop the episode's sandboxes (in a thread of its own:
        the executor may be full), wait for the call to end, then record the cancellation."""
        for bridge in list(self._bridges.values()):
            bridge.cancel()
        if not future.done():
            episode = self._episode if stage == "step" else self._starting
            turn_index = episode.turn_index if episode is not None else 0
            done = asyncio.get_running_loop().create_future()
            stopper = threading.Thread(target=_close_then, args=(episode, done, asyncio.get_running_loop()),
                                       daemon=True, name="harbor-gym-cancel")
            stopper.start()
            try:
                await asyncio.wait_for(asyncio.shield(done), _CANCEL_WAIT_S)
                await asyncio.wait_for(asyncio.shield(future), _CANCEL_WAIT_S)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            except Exception:  # the interrupted call's own failure: the cancellation wins
                pass
            if stage == "step" and episode is not None:
                self._mark_cancelled(episode, turn_index)
        elif stage == "step":
            pass  # the turn had finished: its result stands
        if stage == "reset" and self._state is EnvState.RUNNING and future.done() and not future.cancelled():
            self._close_episode()  # the reset had finished: nothing of it may run on
            self._state = EnvState.OVER

    def _mark_cancelled(self, episode: Any, turn_index: int) -> None:
        """The episode is over: truncated by cancellation, ungraded, not agent-caused (issue 15)."""
        result = self._last_result if self._state is EnvState.OVER else None
        if result is None:
            result = episode.result()
        message = f"{self.task.id}: turn {turn_index + 1}: cancelled by the caller (astep)"
        turns = tuple(dataclasses.replace(t, agent_caused=False, outage_cause=None, reward=None,
                                          failure_kind=CANCELLED_KIND, failure_message=message)
                      if t.index >= turn_index else t for t in result.turns)
        self._last_result = dataclasses.replace(
            result, reward=None, verifier_rewards={}, graded=False, failure_kind=CANCELLED_KIND, retryable=True,
            failure_message=message, agent_caused=False, outage_cause=None, turns=turns)
        self._close_episode()
        self._state = EnvState.OVER

    def render(self) -> str | None:
        """``ansi``: a readable text of the current turn and the last result; ``None`` otherwise."""
        if self.render_mode != "ansi":
            return None
        obs = self._observation() if self._state is not EnvState.UNSTARTED else None
        lines = [f"task {self._current_task().id}: {self._state.value}"]
        if obs is not None:
            lines.append(f"turn {obs['turn_index'] + 1}/{obs['num_turns']} step {obs['step_name']!r}")
            if obs["instruction"]:
                lines.append("instruction:\n  " + obs["instruction"].strip().replace("\n", "\n  "))
        if self._last_record is not None:
            rec = self._last_record
            lines.append(
                f"last turn {rec.step_name!r}: reward {rec.reward} verifier {dict(rec.verifier_rewards)}"
                + (f" failure {rec.failure_kind}" if rec.failure_kind else "")
            )
        if self._last_result is not None:
            res = self._last_result
            lines.append(f"episode: reward {res.reward} ({res.strategy}) stopped_after_turn {res.stopped_after_turn}")
        return "\n".join(lines) + "\n"

    def close(self, *, wait_removed: bool = True) -> None:
        """Stop every sandbox of the env (GYM-7). Idempotent; the env cannot be reset afterwards.

        With warm pools, the sandboxes its episodes were handed are removed before this returns (a pool retires
        them in the background otherwise); the pool's own warm sandboxes stay for other envs until
        `harbor_gym.sandbox.pool.close_pools` (also run at interpreter exit). ``wait_removed=False`` (for a
        caller that waits on the pool factory itself later, as the rollout collector does) returns once the
        episode's sandboxes were handed back for removal."""
        try:
            self._close_episode()
        finally:
            self._state = EnvState.CLOSED
            try:
                wait = getattr(self._sandbox_factory or self._own_pool_factory, "wait_removed", None)
                if wait is not None and wait_removed:
                    wait(60.0)
            finally:
                super().close()

    # --- internals -------------------------------------------------------------------------------------
    def _factory(self) -> Callable | None:
        """The sandbox factory of the next episode: the given one; else, with ``pool_size > 0``, this env's
        `PoolFactory` (one per env, so that ``close`` can wait for what it handed out); else ``None`` (the
        episode's default)."""
        if self._sandbox_factory is not None:
            return self._sandbox_factory
        if self.config.pool_size > 0 and self._own_pool_factory is None:
            from harbor_gym.sandbox.pool import pool_factory

            self._own_pool_factory = pool_factory(self.config)
        return self._own_pool_factory

    def _select_task(self, options: dict[str, Any]):
        return self.task

    def _current_task(self):
        return self.task

    def _close_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is not None:
            episode.close()

    def _observation(self) -> dict[str, Any]:
        """GYM-3: the next turn's observation, or at the end ``instruction=""`` and the last turn that ran."""
        task = self._current_task()
        obs: dict[str, Any]
        if self._state is EnvState.RUNNING and self._episode is not None and self._episode.next_step is not None:
            step = self._episode.next_step
            obs = {
                "step_name": step.name,
                "turn_index": int(step.index),
                "num_turns": len(task.steps),
                "instruction": self._episode.next_instruction,
            }
        else:
            last = self._last_record
            obs = {
                "step_name": last.step_name if last is not None else task.steps[0].name,
                "turn_index": int(last.index + 1) if last is not None else 0,
                "num_turns": len(task.steps),
                "instruction": "",
            }
        if self._with_task_id:
            obs["task_id"] = task.id
        return obs


def _close_then(episode: Any, done: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
    """Close ``episode`` (its sandboxes stop; an exec in flight fails at once), then settle ``done``."""
    try:
        if episode is not None:
            episode.close()
    except Exception:  # a dead engine: the episode's sandboxes are the reaper's now
        pass
    finally:
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
        except RuntimeError:  # the loop closed meanwhile
            pass


class HarborDatasetEnv(HarborEnv):
    """A folder of task folders as one env: each ``reset`` picks a task (SPEC GYM-1 per task).

    The task is drawn with ``np_random`` (reproducible under ``reset(seed=...)``) or named by
    ``reset(options={"task": id})``. Observations carry ``task_id``. Tasks that fail to load are kept in
    ``failures`` and never drawn.

    Raises:
        TaskLoadError: the dataset's own settings are refused (LOAD-16) or no task loads.
    """

    def __init__(
        self,
        dataset_or_path: Any = None,
        config: EnvConfig | Mapping[str, Any] | None = None,
        agent: Any = None,
        render_mode: str | None = None,
        *,
        sandbox_factory: Callable | None = None,
        path: str | Path | None = None,
        executor: Executor | None = None,
    ) -> None:
        from harbor_gym.task import Dataset, load_dataset

        source = _exactly_one(dataset_or_path, path, "HarborDatasetEnv", "dataset_or_path")
        _check_render_mode(render_mode, self.metadata["render_modes"])
        self.dataset = source if isinstance(source, Dataset) else load_dataset(Path(source), _as_config(config))
        self.failures = dict(self.dataset.failures)
        if not self.dataset.tasks:
            raise TaskLoadError("no task of the dataset loads", path=self.dataset.path, rule="LOAD-1")
        self.task_ids = sorted(self.dataset.tasks)
        for task_id in self.task_ids:
            _check_turn_bound(self.dataset.tasks[task_id])
        self.task = self.dataset.tasks[self.task_ids[0]]
        self._init_common(config, agent, render_mode, sandbox_factory, with_task_id=True, executor=executor)

    def _select_task(self, options: dict[str, Any]):
        wanted = options.pop("task", None)
        if wanted is None:
            wanted = self.task_ids[int(self.np_random.integers(0, len(self.task_ids)))]
        elif wanted not in self.dataset.tasks:
            raise ConfigError(
                f"no task {wanted!r} in the dataset (known: {', '.join(self.task_ids)})", field="reset(options.task)"
            )
        self.task = self.dataset.tasks[wanted]
        return self.task
