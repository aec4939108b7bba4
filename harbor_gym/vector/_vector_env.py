"""`HarborVectorEnv`: N Harbor envs as one ``gymnasium.vector.VectorEnv``, their turns run concurrently.

Sub-envs wait on sandboxes, not on Python, so their ``reset``/``step`` calls run in worker threads (``executor=
"thread"``) or in Ray actors spread over a cluster (``executor="ray"``, `harbor_gym.vector._ray`). Sandboxes come
from warm pools (`harbor_gym.sandbox.pool`), so a reset claims a started sandbox and the previous episode's teardown
happens in the background.

Faults (SPEC GYM-2, issue 15: a vector env never lies). An exception from one sub-env's ``step`` or ``reset`` (an
outage, a `SeedError`, a lost actor) never stops the other sub-envs: their calls finish first. Then:

- a non-retryable failure (the task's image cannot be had, a refusal, a defect) with ``on_error="raise"`` (the
  default) raises `SubEnvError` naming the slot, the task and the cause; with ``on_error="mask"`` that slot's
  reward is NaN, its ``truncated`` is ``True`` and ``info["trainable"][i]`` is ``False``;
- a retryable failure (an outage) gives ``truncated=True``, reward 0.0 and ``info["trainable"][i] = False``;
- a slot failing `MAX_CONSECUTIVE_FAILURES` calls in a row (default; ``max_consecutive_failures``) raises
  `SubEnvError` whatever ``on_error`` says, so a dead engine cannot loop forever.

A faulted slot's info carries ``error`` (the cause as text), ``error_type``, ``error_stage`` (``"step"`` or
``"reset"``) and ``retryable``. Every step's info has ``trainable`` for every slot: the turn record's
``trainable`` (GYM-13: false for masked, ungraded and infrastructure-outage turns), ``False`` for a faulted slot.
A sub-env whose reset failed has no episode: its next step runs no action and is reported ``truncated`` with the
same cause, after which it is reset again (``same-step``/``next-step``) or waits for ``reset(options=
{"reset_mask": ...})`` (``disabled``).

Per-slot agents (issue 15): with ``agent_factory=f``, every reset of slot ``i`` announces a fresh agent ``f(i)``
(GYM-4), kept in ``venv.agents[i]``; a step action ``None`` is that agent, so continued sessions (SES-3) work.

Close and interrupts (SPEC GYM-7): ``close`` never waits behind a running turn. It stops every sub-env's sandboxes
from the calling thread (each sub-env in a short-lived thread of its own, never in the worker pool), so an in-flight
turn's exec fails at once and ends as an outage; it then lets the workers finish (bounded by `INFLIGHT_BOUND_S`) and
closes again whatever a reset racing the first pass started. A ``KeyboardInterrupt`` (Ctrl-C) or ``SystemExit`` (the
SIGTERM handler of `harbor_gym.sandbox.lease.exit_on_sigterm`, installed by the constructor) raised while ``reset``
or ``step`` waits for the sub-envs closes the vector env that way, then propagates: ``try: venv.step(...)
finally: venv.close()`` (or no ``finally`` at all) leaves nothing running within seconds, mid-turn.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from copy import deepcopy
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from harbor_gym.config import EnvConfig
from harbor_gym.errors import ConfigError, HarborGymError, ResetNeededError, SubEnvError
from harbor_gym.spaces import ScriptSpace, observation_space
from harbor_gym.vector._subenv import EnvRecipe, LocalSubEnv, SubEnv

__all__ = ["HarborVectorEnv", "EXECUTORS", "INFLIGHT_BOUND_S", "ON_ERROR", "MAX_CONSECUTIVE_FAILURES"]

log = logging.getLogger("harbor_gym.vector")

#: Where sub-envs live: worker threads of this process, or Ray actors.
EXECUTORS = ("thread", "ray")

#: How long ``close`` waits for the workers' in-flight calls once every sandbox was stopped (they end in
#: milliseconds as outages; a reset still seeding may take this long), before closing the sub-envs once more.
INFLIGHT_BOUND_S = 10.0

_MODES = {m.value: m for m in AutoresetMode}

#: What a non-retryable sub-env failure does: raise `SubEnvError`, or mask the slot (reward NaN, not trainable).
ON_ERROR = ("raise", "mask")
#: A slot whose reset/step fails this many calls in a row raises `SubEnvError` (any ``on_error``).
MAX_CONSECUTIVE_FAILURES = 5


def _mode(value: AutoresetMode | str) -> AutoresetMode:
    if isinstance(value, AutoresetMode):
        return value
    key = str(value).replace("-", "_").lower()
    aliases = {"next_step": "NextStep", "same_step": "SameStep", "disabled": "Disabled"}
    resolved = _MODES.get(str(value)) or _MODES.get(aliases.get(key, ""))
    if resolved is None:
        raise ConfigError(f"unknown autoreset_mode {value!r}; use one of same-step, next-step, disabled",
                          field="autoreset_mode")
    return resolved


def _is_action(action: Any) -> bool:
    from harbor_gym.agents import Oracle
    from harbor_gym.agents._protocol import is_agent

    return isinstance(action, (str, Oracle)) or is_agent(action)  # run(turn), or a HarnessSession (SES-3)


class HarborVectorEnv(VectorEnv):
    """``num_envs`` Harbor envs stepped together; each sub-env's turn runs concurrently with the others'.

    Args:
        num_envs: how many sub-envs (with ``path``); ignored when ``env_fns`` is given.
        path: a task folder or a folder of task folders (each sub-env a `HarborEnv` / `HarborDatasetEnv`).
        config: `EnvConfig` or ``dict`` for every sub-env.
        render_mode: accepted for Gymnasium's ``make_vec``; only ``None`` is supported.
        env_fns: instead of ``path``: callables each building one env (picklable ones for ``executor="ray"``).
        autoreset_mode: ``"same-step"`` (default), ``"next-step"`` or ``"disabled"`` (Gymnasium 1.x), or an
            `AutoresetMode`. With ``disabled``, reset ended sub-envs with ``reset(options={"reset_mask": m})``.
        executor: ``"thread"`` (default) or ``"ray"`` (extra ``harbor_gym[ray]``; an initialised Ray, else the
            cluster of ``$RAY_ADDRESS``, else a local one-node cluster: `harbor_gym.vector._placement.ensure_ray`).
            With Ray, each sub-env is an actor that Ray places on a node declaring the custom resource
            ``harbor_engine`` (``ray start --resources='{"harbor_engine": K}'`` with ``DOCKER_HOST`` naming that
            node's engine), so it uses that node's engine and pools; a lost node is that slot's outage, named.
        pool_size: warm sandboxes kept per sandbox spec in each process hosting sub-envs; ``None``:
            ``config.pool_size`` if set, else ``num_envs`` (thread) or 1 (each Ray actor); ``0``: no pool.
        max_workers: worker threads (default ``num_envs``).
        ray_actor_options: extra ``.options()`` of the Ray actors, each key replacing the default's
            (`harbor_gym.vector._ray.DEFAULT_ACTOR_OPTIONS`: ``num_cpus=0``, ``SPREAD``, ``max_concurrency=2`` so
            that ``close`` runs beside a busy ``step``, ``resources={"harbor_engine": 1}``; ``{"resources": {}}``
            places actors on any node).
        ray_placement_timeout_s: how long Ray may take to place the actors (at construction, and a new actor
            after a lost one) before `SandboxUnavailableError` (default 60 s).
        on_error: ``"raise"`` (default) or ``"mask"``: what a non-retryable sub-env failure does (module docstring).
        max_consecutive_failures: a slot failing this many calls in a row raises `SubEnvError` (default 5).
        agent_factory: ``slot -> agent``: a fresh agent announced at every reset of that slot (``executor=
            "thread"`` only); a step action ``None`` is the slot's agent (``venv.agents[i]``).

    Raises:
        ConfigError: bad arguments (named). TaskLoadError: the folder is refused (no sandbox starts).
        ImportError: ``executor="ray"`` without Ray installed. SandboxUnavailableError: ``executor="ray"`` and Ray
            placed not every actor within ``ray_placement_timeout_s`` (no node offers ``harbor_engine``).

    Actions: a sequence of ``num_envs`` per-env actions, each a ``str`` script, ``Oracle()`` or an agent object
    (SPEC GYM-4). Observations: a ``dict`` of batched entries (text entries as tuples of ``str``, numbers as
    arrays), as Gymnasium's ``concatenate`` lays out the single observation space; no shared memory.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        path: str | Path | None = None,
        config: EnvConfig | Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        *,
        env_fns: Sequence[Callable[[], Any]] | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        executor: str = "thread",
        pool_size: int | None = None,
        max_workers: int | None = None,
        ray_actor_options: Mapping[str, Any] | None = None,
        ray_placement_timeout_s: float = 60.0,
        max_episode_steps: int | None = None,
        on_error: str = "raise",
        max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES,
        agent_factory: Callable[[int], Any] | None = None,
    ) -> None:
        if render_mode is not None:
            raise ConfigError("HarborVectorEnv renders nothing; use render_mode=None", field="render_mode")
        if max_episode_steps is not None:
            raise ConfigError("max_episode_steps is not supported; the task's steps and deadline bound an episode",
                              field="max_episode_steps")
        if executor not in EXECUTORS:
            raise ConfigError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}", field="executor")
        if on_error not in ON_ERROR:
            raise ConfigError(f"unknown on_error {on_error!r}; use one of {', '.join(ON_ERROR)}", field="on_error")
        if max_consecutive_failures < 1:
            raise ConfigError(f"must be >= 1, got {max_consecutive_failures}", field="max_consecutive_failures")
        if agent_factory is not None and executor != "thread":
            raise ConfigError("agent_factory needs executor='thread' (an agent object cannot cross to a Ray actor "
                              "and stay the same object)", field="agent_factory")
        self.on_error = on_error
        self.max_consecutive_failures = int(max_consecutive_failures)
        self._agent_factory = agent_factory
        if (env_fns is None) == (path is None):
            raise ConfigError("give exactly one of path and env_fns", field="HarborVectorEnv")
        cfg = EnvConfig.coerce(dict(config) if isinstance(config, Mapping) else config)
        n = len(env_fns) if env_fns is not None else int(num_envs)
        if n < 1:
            raise ConfigError(f"num_envs must be >= 1, got {n}", field="num_envs")
        self.num_envs = n
        self.config = cfg
        self.executor = executor
        self.autoreset_mode = _mode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = None
        if pool_size is None:
            pool_size = cfg.pool_size or (n if executor == "thread" else 1)
        if pool_size < 0:
            raise ConfigError(f"pool_size must be >= 0, got {pool_size}", field="pool_size")
        self.pool_size = pool_size
        pooled = cfg.replace(pool_size=pool_size) if pool_size else cfg
        self._pool_config = pooled
        if env_fns is not None:
            recipes = [EnvRecipe(env_fn=fn) for fn in env_fns]
        else:
            resolved = Path(path).resolve()
            if not resolved.is_dir():
                raise ConfigError(f"{path}: not a task folder or a folder of task folders", field="path")
            plain = pooled.model_dump(mode="json")
            recipes = [EnvRecipe(path=str(resolved), config=plain, use_pool=pool_size > 0) for _ in range(n)]
        from harbor_gym.sandbox.lease import exit_on_sigterm

        exit_on_sigterm()  # its sandboxes register from worker threads: SIGTERM must still take the Ctrl-C path
        self._threads = ThreadPoolExecutor(max_workers=max_workers or n, thread_name_prefix="harbor-gym-vector")
        self._closed_flag = False  # no new work (set first by close)
        self._close_done = False  # every sub-env closed (an interrupted close can be repeated)
        self._inflight: list[Future] = []
        self._subs: list[SubEnv] = []
        try:
            self._subs = self._make_subs(recipes, ray_actor_options, ray_placement_timeout_s)
        except BaseException:
            self._close_subs()
            self._threads.shutdown(wait=False)
            raise
        with_task_id = bool(path is not None and not (Path(path) / "task.toml").is_file())
        if env_fns is not None:
            with_task_id = self._probe_task_id()
        self.single_observation_space = observation_space(with_task_id=with_task_id)
        self.single_action_space = ScriptSpace()
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._observations = create_empty_array(self.single_observation_space, n)
        self._env_obs: list[dict | None] = [None] * n
        self._rewards = np.zeros(n, dtype=np.float64)
        self._terminations = np.zeros(n, dtype=np.bool_)
        self._truncations = np.zeros(n, dtype=np.bool_)
        self._autoreset_envs = np.zeros(n, dtype=np.bool_)
        self._broken: list[str | None] = ["no reset yet"] * n
        self._broken_info: list[dict] = [{} for _ in range(n)]
        self._failures_in_a_row = [0] * n
        self._fatal: list[SubEnvError] = []  # raised by reset/step once every sub-env's call has finished
        self._task_ids: list[str | None] = [None] * n
        #: issue 15: the agent of each slot's current episode (``agent_factory``), else ``None``.
        self.agents: list[Any] = [None] * n

    # --- construction ----------------------------------------------------------------------------------
    def _make_subs(self, recipes: list[EnvRecipe], ray_actor_options: Mapping[str, Any] | None,
                   placement_timeout_s: float) -> list[SubEnv]:
        if self.executor == "ray":
            from harbor_gym.vector._ray import make_ray_subenvs

            return make_ray_subenvs(recipes, actor_options=ray_actor_options,
                                    placement_timeout_s=placement_timeout_s)
        futures = [self._threads.submit(r.build) for r in recipes]
        subs: list[SubEnv] = []
        first: BaseException | None = None
        for future in futures:
            try:
                subs.append(LocalSubEnv(future.result()))
            except BaseException as exc:  # build every env, close them all if one failed, re-raise the first
                first = first or exc
        if first is not None:
            for sub in subs:
                sub.close()
            raise first
        return subs

    def _probe_task_id(self) -> bool:
        sub = self._subs[0]
        if getattr(sub, "has_task_id", None) is not None:
            return bool(sub.has_task_id)
        env = getattr(sub, "env", None)
        space = getattr(getattr(env, "unwrapped", env), "observation_space", None)
        return bool(space is not None and "task_id" in getattr(space, "spaces", {}))

    # --- Gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict, dict[str, Any]]:
        """Reset every sub-env (or those of ``options["reset_mask"]``) concurrently.

        ``seed``: ``None``, an ``int`` (sub-env ``i`` gets ``seed + i``) or one seed per sub-env. Other options go
        to every reset sub-env. A sub-env whose reset fails gets ``error`` in its info (see the module docstring).

        Raises:
            ResetNeededError: the vector env is closed. ValueError/TypeError: a bad seed list or reset mask.
        """
        self._require_open()
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"seed must be None, an int or {n} seeds, got {len(seeds)}")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones(n, dtype=np.bool_)
        elif not isinstance(mask, np.ndarray) or mask.shape != (n,) or mask.dtype != np.bool_:
            raise TypeError(f"options['reset_mask'] must be a numpy bool array of shape ({n},), got {mask!r}")
        elif not mask.any():
            raise ValueError("options['reset_mask'] must select at least one sub-env")
        picked = [i for i in range(n) if mask[i]]
        self._fatal = []
        results = self._run_all(lambda i: self._reset_one(i, seeds[i], options), picked)
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(picked, results):
            self._env_obs[i] = obs
            self._terminations[i] = self._truncations[i] = self._autoreset_envs[i] = False
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._raise_fatal()
        return deepcopy(self._observations), infos

    def step(self, actions: Sequence[Any]) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Run one turn in every sub-env concurrently (an ended one autoresets per ``autoreset_mode``).

        Returns batched ``(obs, rewards, terminations, truncations, infos)``; infos are merged with Gymnasium's
        ``_key`` masks; ``same-step`` adds ``final_obs``/``final_info`` for sub-envs that ended.

        Raises:
            ResetNeededError: closed, never reset, or (``disabled``) stepping an ended sub-env; nothing ran.
            TypeError/ValueError: not ``num_envs`` actions, or one is not an action (GYM-4); nothing ran.
        """
        self._require_open()
        if self._env_obs[0] is None and all(o is None for o in self._env_obs):
            raise ResetNeededError("step() before reset(): call reset() first", field="step", rule="GYM-7")
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence) and not isinstance(
                actions, np.ndarray):
            raise TypeError(f"actions must be a sequence of {self.num_envs} per-env actions, got {type(actions)}")
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        for i, action in enumerate(actions):
            if action is None and self._agent_factory is not None:
                actions[i] = action = self.agents[i]
            if not _is_action(action):
                raise TypeError(f"action {i} is {type(action).__name__}: use a str script, Oracle() or an object "
                                "with run(turn) (GYM-4)")
            if self.autoreset_mode is AutoresetMode.DISABLED and self._autoreset_envs[i]:
                raise ResetNeededError(f"sub-env {i} has ended; reset it with reset(options={{'reset_mask': m}}) "
                                       "before stepping it (autoreset_mode='disabled')", field="step", rule="GYM-7")
        self._fatal = []
        results = self._run_all(self._step_one, range(self.num_envs), actions)
        infos: dict[str, Any] = {}
        for i, (obs, reward, term, trunc, info) in enumerate(results):
            self._env_obs[i] = obs
            self._rewards[i] = reward
            self._terminations[i] = term
            self._truncations[i] = trunc
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        self._raise_fatal()
        return (deepcopy(self._observations), np.copy(self._rewards), np.copy(self._terminations),
                np.copy(self._truncations), infos)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env (one failure does not stop the rest), then the warm pools this env's config uses.

        Never queued behind a running turn (see the module docstring): sandboxes are stopped from the calling
        thread, in-flight calls are awaited for at most `INFLIGHT_BOUND_S`, then the sub-envs are closed once more.
        Idempotent; a close cut short (a second Ctrl-C) is completed by the next call."""
        if self._close_done:
            return
        self._closed_flag = True
        try:
            self._close_subs()
        finally:
            self._threads.shutdown(wait=False, cancel_futures=True)
            _, late = wait(self._inflight, timeout=INFLIGHT_BOUND_S)
            if late:
                log.warning("%d sub-env call(s) still running %.0f s after close stopped their sandboxes",
                            len(late), INFLIGHT_BOUND_S)
            self._close_subs()  # what a reset racing the first pass started
            if self.executor == "thread" and self.pool_size:
                _close_pools_of(self._pool_config)
        self._close_done = True

    def _run_all(self, fn: Callable[..., Any], *iterables: Any) -> list[Any]:
        """``fn`` over the argument lists in the workers, results in order. An interrupt while waiting
        (``KeyboardInterrupt``, ``SystemExit``) closes the vector env (every sandbox stopped, in-flight turns ended
        as outages), then propagates."""
        futures = [self._threads.submit(fn, *args) for args in zip(*iterables)]
        self._inflight = futures
        try:
            return [future.result() for future in futures]
        except (KeyboardInterrupt, SystemExit):
            self.close()
            raise

    # --- one sub-env (runs in a worker thread; never raises) ---------------------------------------------
    def _reset_one(self, i: int, seed: int | None, options: dict[str, Any]) -> tuple[dict, dict]:
        if self._closed_flag:  # closing: start nothing (an autoreset after an interrupted turn)
            info = {"error": "ResetNeededError: the vector env was closed", "error_type": "ResetNeededError",
                    "error_stage": "reset", "retryable": False}
            return self._placeholder(i), info
        options = dict(options) if options else None
        try:
            if self._agent_factory is not None:  # issue 15: a fresh agent per episode, announced (GYM-4, SES-3)
                self.agents[i] = self._agent_factory(i)
                options = {**(options or {}), "agent": self.agents[i]}
            obs, info = self._subs[i].reset(seed, options)
        except Exception as exc:  # the sub-env's fault stays the sub-env's (GYM-2)
            info = self._fault(i, exc, "reset")
            return self._placeholder(i), info
        self._broken[i] = None
        self._failures_in_a_row[i] = 0
        info = dict(info)
        if info.get("task_id"):
            self._task_ids[i] = str(info["task_id"])
        return obs, info

    def _step_one(self, i: int, action: Any) -> tuple[dict, float, bool, bool, dict]:
        mode = self.autoreset_mode
        if mode is AutoresetMode.NEXT_STEP and self._autoreset_envs[i]:
            obs, info = self._reset_one(i, None, {})
            if self._broken[i] is not None:
                return obs, self._fault_reward(info), False, True, info
            return obs, 0.0, False, False, info
        if self._broken[i] is not None:
            obs = self._placeholder(i)
            info = {**self._broken_info[i], "error_stage": "reset", "trainable": False}
            reward, term, trunc = self._fault_reward(info), False, True
        else:
            try:
                obs, reward, term, trunc, info = self._subs[i].step(action)
                info = dict(info)
                self._failures_in_a_row[i] = 0
                info["trainable"] = bool(getattr(info.get("turn"), "trainable", True))
            except Exception as exc:  # an infrastructure fault: this sub-env's truncation (GYM-2)
                info = self._fault(i, exc, "step")
                obs, term, trunc = self._placeholder(i), False, True
                reward = self._fault_reward(info)
        if mode is AutoresetMode.SAME_STEP and (term or trunc):
            final_obs, final_info = obs, info
            obs, reset_info = self._reset_one(i, None, {})
            info = {**reset_info, "final_obs": final_obs, "final_info": final_info,
                    "trainable": bool(final_info.get("trainable", True))}
            if self._broken[i] is not None:
                trunc = True
        return obs, float(reward), bool(term), bool(trunc), info

    def _fault(self, i: int, exc: BaseException, stage: str) -> dict[str, Any]:
        kind = getattr(exc, "type_name", None) or type(exc).__name__  # a remote error names its own type
        cause = f"{kind}: {exc}"
        if self._closed_flag:  # a call cut short by close: expected, not worth a traceback
            log.debug("sub-env %d: %s ended by close: %s", i, stage, cause)
        else:
            log.warning("sub-env %d: %s failed: %s", i, stage, cause, exc_info=not isinstance(exc, HarborGymError))
        retryable = bool(getattr(exc, "retryable", True))
        info = {"error": cause, "error_type": kind, "error_stage": stage, "retryable": retryable,
                "trainable": False}
        self._broken[i] = cause
        self._broken_info[i] = info
        if self._closed_flag:
            return dict(info)
        self._failures_in_a_row[i] += 1
        task = self._task_of(i)
        where = f"sub-env {i} (task {task})" if task else f"sub-env {i}"
        if self._failures_in_a_row[i] >= self.max_consecutive_failures:
            self._fatal.append(SubEnvError(
                f"{where} failed {self._failures_in_a_row[i]} calls in a row (max_consecutive_failures); last, "
                f"at {stage}: {cause}", slot=i, task_id=task, cause=cause, field="HarborVectorEnv"))
        elif not retryable and self.on_error == "raise":
            self._fatal.append(SubEnvError(f"{where} failed at {stage} for a reason a retry cannot mend: {cause} "
                                           "(on_error='mask' masks the slot instead)", slot=i, task_id=task,
                                           cause=cause, field="HarborVectorEnv"))
        return dict(info)

    def _fault_reward(self, info: Mapping[str, Any]) -> float:
        """A faulted slot's reward: NaN when non-retryable (``on_error="mask"``), else 0.0 (trainable False)."""
        return float("nan") if not info.get("retryable", True) else 0.0

    def _task_of(self, i: int) -> str | None:
        """The task of slot ``i``: from its last reset, else its env's task when it lives here."""
        if self._task_ids[i]:
            return self._task_ids[i]
        env = getattr(self._subs[i], "env", None) if i < len(self._subs) else None
        task = getattr(getattr(env, "unwrapped", env), "task", None)
        recipe_task = getattr(task, "id", None)
        return str(recipe_task) if recipe_task else getattr(self._subs[i], "task_id", None) if i < len(
            self._subs) else None

    def _raise_fatal(self) -> None:
        """Issue 15: the first slot that failed for good, once every sub-env's call has finished."""
        if self._fatal:
            first, self._fatal = self._fatal[0], []
            raise first

    def _placeholder(self, i: int) -> dict[str, Any]:
        """The observation of a sub-env without an episode: its last one with an empty instruction."""
        last = self._env_obs[i]
        if last is not None:
            return {**last, "instruction": ""}
        obs: dict[str, Any] = {"step_name": "", "turn_index": 0, "num_turns": 0, "instruction": ""}
        if "task_id" in self.single_observation_space.spaces:
            obs["task_id"] = ""
        return obs

    # --- helpers -----------------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._closed_flag:
            raise ResetNeededError("the vector env is closed; make a new one", field="HarborVectorEnv",
                                   rule="GYM-7")

    def _close_subs(self) -> None:
        """Close every sub-env at once, each in a short-lived thread of its own (the workers may be busy with
        turns: a close queued behind them would wait the turns out); one failure does not stop the rest."""
        errors: list[BaseException] = []

        def close(sub: SubEnv) -> None:
            try:
                sub.close()
            except Exception as exc:  # close every sub-env, then report the first failure
                errors.append(exc)

        closers = [threading.Thread(target=close, args=(sub,), name="harbor-gym-vector-close", daemon=True)
                   for sub in self._subs]
        for t in closers:
            t.start()
        for t in closers:
            t.join()
        if errors:
            log.warning("closing a sub-env failed: %s", errors[0])

    def __repr__(self) -> str:
        return (f"HarborVectorEnv(num_envs={self.num_envs}, executor={self.executor!r}, "
                f"autoreset_mode={self.autoreset_mode.value!r}, pool_size={self.pool_size})")


def _close_pools_of(config: EnvConfig) -> None:
    """Close the process's warm pools that ``config`` uses (same backend and settings)."""
    from harbor_gym.sandbox.pool import pool_factory

    for pool in pool_factory(config).pools():
        pool.close()
