"""TRL: a ``rollout_func`` for ``trl.GRPOTrainer`` that runs harbor_gym episodes, and the matching reward function.

``GRPOTrainer`` calls ``rollout_func(prompts, trainer)`` with the prompts of its batch (each already repeated
``num_generations`` times) and expects ``prompt_ids``, ``completion_ids``, ``logprobs`` (one row per prompt, in
order); every other key is forwarded to the reward functions. This adapter returns, per prompt, the tokens of one
harbor_gym episode of the prompt's task, exactly as the serving engine sent them (never re-tokenised), with
``env_mask`` (TRL's name for the loss mask: 0 on tool output and chat markup) and ``episode_reward``.

Episodes that were not graded or are not trainable get ``episode_reward`` ``None`` (TRL treats it as no reward)
and an all-zero ``env_mask``; an episode with no tokens gets a one-token placeholder that trains nothing. When an
episode's calls do not form one token sequence, the row holds its first sample and ``harbor_samples_left_out``
says how many samples were left out of this row (see `harbor_gym.training` for all of them).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harbor_gym.run.collector import rollouts
from harbor_gym.task import load_task
from harbor_gym.training import EpisodeSamples, rollout_samples

__all__ = ["make_rollout_func", "episode_reward", "sampling_params", "rows"]


def sampling_params(trainer: Any) -> dict[str, Any]:
    """The trainer's sampling parameters (``temperature``, ``top_p``, ``max_tokens`` from
    ``max_completion_length``), those it sets."""
    args = getattr(trainer, "args", None)
    out: dict[str, Any] = {}
    for name, key in (("temperature", "temperature"), ("top_p", "top_p"), ("max_completion_length", "max_tokens")):
        value = getattr(args, name, None)
        if value is not None:
            out[key] = value
    return out


def _task_folders(tasks: Any) -> dict[str, str]:
    if isinstance(tasks, Mapping):
        return {str(k): str(v) for k, v in tasks.items()}
    root = Path(tasks)
    if (root / "task.toml").is_file():
        return {load_task(root).id: str(root)}
    folders = {load_task(p).id: str(p) for p in sorted(root.iterdir()) if (p / "task.toml").is_file()}
    if not folders:
        raise ValueError(f"{root}: neither a task folder nor a folder of task folders (no task.toml)")
    return folders


def _prompt_task(prompt: Any, folders: Mapping[str, str]) -> str:
    if len(folders) == 1:
        return next(iter(folders))
    text = prompt[-1]["content"] if isinstance(prompt, Sequence) and not isinstance(prompt, str) else prompt
    if text not in folders:
        raise ValueError(f"prompt names task {text!r}, which is not among {sorted(folders)}: a prompt's last "
                         f"message content must be a task id")
    return str(text)


def rows(samples: Sequence[EpisodeSamples], placeholder_id: int) -> dict[str, list]:
    """The TRL rollout output of one `EpisodeSamples` per prompt (see the module docstring)."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                            "episode_reward", "harbor_trainable", "harbor_failure_kind",
                                            "harbor_samples_left_out")}
    for ep in samples:
        if ep.samples:
            s = ep.samples[0]
            mask = list(s.loss_mask) if ep.trainable else [0] * len(s.loss_mask)
            out["prompt_ids"].append(list(s.prompt_ids))
            out["completion_ids"].append(list(s.completion_ids))
            out["logprobs"].append(list(s.logprobs) if s.logprobs is not None else [0.0] * len(s.completion_ids))
            out["env_mask"].append(mask if s.logprobs is not None else [0] * len(mask))
        else:
            out["prompt_ids"].append([placeholder_id])
            out["completion_ids"].append([placeholder_id])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
        out["episode_reward"].append(float(ep.reward) if ep.trainable and ep.reward is not None else None)
        out["harbor_trainable"].append(ep.trainable)
        out["harbor_failure_kind"].append(ep.failure_kind)
        out["harbor_samples_left_out"].append(max(len(ep.samples) - 1, 0))
    return out


def episode_reward(completions: Any = None, episode_reward: Sequence[float | None] = (), **_: Any) -> list:
    """The reward function matching `make_rollout_func`: each row's episode reward (``None``: none)."""
    return list(episode_reward)


def make_rollout_func(tasks: Any, agent_factory: Callable[[str, Mapping[str, Any]], Any], *,
                      config: Any = None, concurrency: int = 2, layout: str = "auto") -> Callable:
    """A ``rollout_func(prompts, trainer)`` for ``trl.GRPOTrainer``.

    Args:
        tasks: a task folder, a folder of task folders, or a mapping task id -> folder.
        agent_factory: ``(task_id, sampling) -> agent``; ``sampling`` holds `sampling_params` of the trainer, to
            pass to the agent (e.g. ``ChatAgent(..., temperature=...)``).
        config: the `EnvConfig` (or dict) of every episode.
        concurrency: episodes in flight (`harbor_gym.rollouts`).
        layout: the `harbor_gym.training` layout of each episode.
    """
    folders = _task_folders(tasks)
    calls = {"n": 0}

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        names = [_prompt_task(p, folders) for p in prompts]
        sampling = sampling_params(trainer)
        base_seed = calls["n"] * 1_000_003
        calls["n"] += 1

        async def run_all() -> dict[str, list]:
            async def one(task_id: str, count: int) -> list:
                got = []
                async for r in rollouts(folders[task_id], lambda t, k, s: agent_factory(t, sampling),
                                        rollouts_per_task=count, concurrency=concurrency, config=config,
                                        seed=base_seed):
                    got.append(r)
                return sorted(got, key=lambda r: r.rollout)
            counts = Counter(names)
            done = await asyncio.gather(*(one(t, c) for t, c in counts.items()))
            return dict(zip(counts, done))

        by_task = asyncio.run(run_all())
        taken: Counter = Counter()
        samples = []
        for name in names:
            samples.append(rollout_samples(by_task[name][taken[name]], layout=layout))
            taken[name] += 1
        tok = getattr(trainer, "processing_class", None)
        pad = getattr(tok, "pad_token_id", None) or getattr(tok, "eos_token_id", None) or 0
        return rows(samples, int(pad))

    return rollout_func
