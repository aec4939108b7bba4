"""The ``harbor-gym`` command line: run, prewarm, check, validate, images, gc.

Exit codes, for every command: 0 all good; 1 something checked failed; 2 bad usage or input that cannot be read
(a path that is neither a task folder nor a folder of task folders, an unreadable settings file); 130 interrupted
(Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Sequence

from rich.console import Console
from rich.markup import escape

from harbor_gym.errors import ConfigError, HarborGymError

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(Exception):
    """Bad usage or unreadable input: exit code 2 with a one-line message."""


def _say(console: Console, tag: str, text: str) -> None:
    """Print ``tag`` (rich markup of ours) then ``text`` verbatim: bracketed text in a message, such as a TOML table
    name ``[verifier.environment]``, is never taken for markup."""
    console.print(f"{tag}{escape(text)}" if tag else escape(text))


def _plain_when_piped(table):
    """The run summary as plain text (no box art, no rule lines) when stdout is not a terminal, so that it stays
    readable in a log file or a pipe (printed on a wide console there, so that a cell such as a failure kind is
    never folded mid-word); the boxed table on a terminal."""
    if not _out.is_terminal:
        table.box = None
        table.show_lines = False
        table.show_edge = False
        table.pad_edge = False
    return table


def _engine_backend(requested: str, command: str) -> str:
    """The backend a command uses, decided once before anything runs.

    ``docker`` without an engine is bad input (one line naming the engine address, exit 2), not a storm of
    retryable seed failures; ``auto`` without an engine falls back to ``local`` and says so in one visible line.
    """
    import os

    from harbor_gym.sandbox._engine import engine_answers

    if requested == "local":
        return "local"
    if requested == "podman":
        from harbor_gym.errors import SandboxUnavailableError
        from harbor_gym.sandbox._podman import engine_of, podman_client

        try:
            engine = engine_of(podman_client())  # found or started
        except SandboxUnavailableError as exc:
            raise UsageError(f"--backend podman: {exc}") from exc
        _say(_err, "", f"harbor-gym {command}: {engine.describe()} at {engine.url} ({engine.how})")
        return "podman"
    reason = engine_answers()
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if reason is None:
        return "docker"
    if requested == "docker":
        raise UsageError(f"--backend docker: no Docker engine answers at {where} ({reason.splitlines()[0][:200]}); "
                         "start one (scripts/setup-host.sh) or use --backend local")
    _say(_err, "", f"harbor-gym {command}: no Docker engine answers at {where}; using the local (bubblewrap) backend")
    return "local"


def _is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file()


def _task_targets(paths: Sequence[str], config=None):
    """Yield ``(task_id, loader)`` for every task under ``paths``; a loader returns a Task or raises TaskLoadError.

    A path holding ``task.toml`` is one task; any other folder is a dataset of task folders; a ``NAME@VERSION``
    that is not an existing path is a dataset of the registry in force, fetched once into the cache (as ``run``
    does; issue 16). Tasks load under ``config`` (its ``semantics``: DIFF-8, VER-4, LOAD-6).

    Raises:
        UsageError: a path does not exist (nor names a dataset) or is not a folder; a dataset name that cannot be
            had (no registry, unknown, a wrong commit, a missing task path).
    """
    from harbor_gym.datasets import resolve_dataset
    from harbor_gym.errors import DatasetError, TaskLoadError
    from harbor_gym.task import load_dataset, load_task

    for raw in paths:
        path = Path(raw)
        if not path.exists():
            try:
                folder = resolve_dataset(raw, config)  # a path always wins over a registry name
            except DatasetError as exc:
                raise UsageError(f"{raw}: {exc}") from exc
            if folder is None:
                raise UsageError(f"{raw}: no such file or folder (nor a dataset name NAME@VERSION)")
            path = folder
        if not path.is_dir():
            raise UsageError(f"{raw}: not a task folder or a folder of task folders")
        if _is_task_folder(path):
            yield path.resolve().name, (lambda p=path: load_task(p, config))
            continue
        try:
            dataset = load_dataset(path, config)
        except TaskLoadError as exc:  # the dataset's own settings are refused (LOAD-16)
            yield path.resolve().name, (lambda e=exc: _raise(e))
            continue
        if not dataset.tasks and not dataset.failures:
            raise UsageError(f"{raw}: holds no task folder (no task.toml in it or its subfolders)")
        for task_id in sorted(set(dataset.tasks) | set(dataset.failures)):
            if task_id in dataset.failures:
                yield task_id, (lambda e=dataset.failures[task_id]: _raise(e))
            else:
                yield task_id, (lambda t=dataset.tasks[task_id]: t)


def _raise(error: Exception):
    raise error


def _load_outcome(load) -> tuple[bool, str]:
    """``(ok, text)`` of one task load: the step count, or the error's message. A task whose env templates read a
    host variable outside the (default, empty) allowlist fails here as ``reset()`` would refuse it (LOAD-23)."""
    from harbor_gym.task.hostenv import check_host_env

    try:
        task = load()
        check_host_env(task, ())
    except HarborGymError as exc:
        return False, str(exc)
    return True, f"{len(task.steps)} step{'s' if len(task.steps) != 1 else ''}"


def _cmd_check(args: argparse.Namespace) -> int:
    """Load every task; print one line per task: OK, or the problem (SPEC §3 LOAD rules).

    With ``--semantics``, tasks load under that side of SPEC §14 only. Without it they load under both, and a task
    whose outcome differs (a step name only Harbor accepts, DIFF-8; a verifier image source, VER-4) gets one line per
    semantics, each naming it.
    """
    from harbor_gym.config import EnvConfig

    chosen = [args.semantics] if args.semantics else ["seed", "harbor"]
    outcomes: dict[str, dict[str, tuple[bool, str]]] = {}
    order: list[str] = []
    for semantics in chosen:
        for task_id, load in _task_targets(args.paths, EnvConfig(semantics=semantics)):
            if task_id not in outcomes:
                order.append(task_id)
            outcomes.setdefault(task_id, {})[semantics] = _load_outcome(load)
    failed = 0
    for task_id in order:
        per = outcomes[task_id]
        same = len({v for v in per.values()}) == 1
        for semantics, (ok, text) in per.items():
            where = "" if same else f" [{semantics}]"
            failed += not ok
            if ok:
                _say(_out, "[green]OK[/green]   ", f"{task_id}{where} ({text})")
            else:
                _say(_out, "[red]FAIL[/red] ", f"{task_id}{where}: {text}")
            if same:
                break
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    """Run the oracle through every step of every task (ORACLE-3/4); name each failing step."""
    from harbor_gym.config import EnvConfig
    from harbor_gym.episode import validate

    config = EnvConfig(backend=_engine_backend(args.backend, "validate"), semantics=args.semantics)
    failed = 0
    for task_id, load in _task_targets(args.paths, config):
        try:
            task = load()
            report = validate(task, config=config)
        except HarborGymError as exc:
            failed += 1
            _say(_out, "[red]FAIL[/red] ", f"{task_id}: {exc}")
            continue
        if report.passed:
            rewards = ", ".join(f"{s.name}={s.reward:g}" for s in report.steps)
            _say(_out, "[green]PASS[/green] ", f"{task_id}: {rewards}")
        else:
            failed += 1
            details = report.summary().splitlines()[1:]  # the summary's own "FAIL <task>" head is not repeated
            _say(_out, "[red]FAIL[/red] ", f"{task_id} ({report.path})\n" + "\n".join(details))
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_images(args: argparse.Namespace) -> int:
    """Show the alias tables, the pull policy and the cached build images."""
    from harbor_gym.config import EnvConfig, settings_path

    config = EnvConfig()
    _say(_out, "", f"settings file: {settings_path()}")
    _say(_out, "", f"pull policy:   {config.effective_pull_policy().value}")
    for public, local in sorted(config.effective_image_aliases().items()):
        _say(_out, "", f"alias  {public} -> {local}")
    for image, folder in sorted(config.effective_rootfs_aliases().items()):
        _say(_out, "", f"rootfs {image} -> {folder}")
    from harbor_gym.sandbox._engine import engine_answers, get_client
    from harbor_gym.sandbox.images import CACHE_LABEL, MANAGED_LABEL

    reason = engine_answers()
    if reason is not None:
        _say(_out, "", f"cached build images: no Docker engine answers ({reason.splitlines()[0][:160]})")
        return EXIT_OK
    found = get_client().api.images(filters={"label": [f"{MANAGED_LABEL}=true", f"{CACHE_LABEL}=build"]})
    for image in sorted(found, key=lambda i: -(i.get("Created") or 0)):
        tags = ", ".join(image.get("RepoTags") or []) or image.get("Id", "")[:19]
        _say(_out, "", f"cached {tags} ({(image.get('Size') or 0) / 1e6:.0f} MB)")
    if not found:
        _say(_out, "", "cached build images: none")
    return EXIT_OK


def _cmd_gc(args: argparse.Namespace) -> int:
    """Remove what crashed runs left behind (labelled, lease expired): Docker resources and local sandboxes;
    with --images also the build cache. Resources of live runs are never touched."""
    from harbor_gym.errors import SandboxUnavailableError
    from harbor_gym.sandbox.engines import EngineSet, url_problem
    from harbor_gym.sandbox.gc import collect_garbage
    from harbor_gym.sandbox.local import collect_local_garbage

    status = EXIT_OK
    for url in args.engine:
        if url_problem(url):
            raise UsageError(f"--engine {url_problem(url)}")
    for url in args.engine or [None]:
        where = "docker" if url is None else f"docker {url}"
        try:
            client = None if url is None else EngineSet([url]).engines[0].client
            report = collect_garbage(images=args.images, client=client)
        except SandboxUnavailableError as exc:
            _say(_out, "", f"{where}: skipped ({exc})")
            if url is not None:
                status = EXIT_FAILED
            continue
        for kind in ("containers", "networks", "volumes", "images"):
            names = getattr(report, kind)
            _say(_out, "", f"{where} {kind}: {len(names)} removed" + (f" ({', '.join(names)})" if names else ""))
        _say(_out, "", f"{where}: {len(report.kept_live)} kept (their runs are live)")
        for error in report.errors:
            _say(_err, "", f"harbor-gym gc: {error}")
            status = EXIT_FAILED
    removed = collect_local_garbage()
    _say(_out, "", f"local sandboxes: {len(removed)} removed" + (f" ({', '.join(removed)})" if removed else ""))
    from harbor_gym.episode._logs import reap_stale_temp_logs  # issue 12 item 6: logs of SIGKILLed runs

    folders = reap_stale_temp_logs()
    _say(_out, "", f"temporary log folders of dead runs: {len(folders)} removed")
    return status


def _cmd_prewarm(args: argparse.Namespace) -> int:
    """Fill a warm pool of --size sandboxes for every task under PATH (images resolved or built and cached), print
    the time each took, then remove them (a pool lives in its process; see harbor_gym.vector.prewarm)."""
    from harbor_gym.config import EnvConfig
    from harbor_gym.errors import TaskLoadError
    from harbor_gym.sandbox.pool import close_pools
    from harbor_gym.vector import prewarm

    if args.size < 1:
        raise UsageError(f"--size must be >= 1, got {args.size}")
    path = Path(args.path)
    if not path.is_dir():
        raise UsageError(f"{args.path}: not a task folder or a folder of task folders")
    config = EnvConfig(backend=_engine_backend(args.backend, "prewarm"), labels=_parse_labels(args.label))
    try:
        results = prewarm(path, size=args.size, config=config, timeout_s=args.timeout)
    except TaskLoadError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        close_pools()
    for r in results:
        if r.skipped:
            _say(_out, "", f"SKIP {r.task_id}: {r.error}")
        elif r.ok:
            _say(_out, "[green]WARM[/green] ", f"{r.task_id}: {r.ready}/{r.size} sandboxes ready in {r.seconds:.1f}s")
        else:
            _say(_out, "[red]FAIL[/red] ", f"{r.task_id}: {r.ready}/{r.size} ready" + (f": {r.error}" if r.error else ""))
    return EXIT_OK if results and all(r.ok for r in results) else EXIT_FAILED


def _parse_labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {item!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _agent_args(args: argparse.Namespace) -> dict:
    """The agent's constructor arguments: ``--agent-arg`` items, and for ``chat`` ``--model``, ``--base-url``,
    ``--api-key-env`` (GYM-13)."""
    from harbor_gym.run.agents import parse_agent_args

    kwargs = parse_agent_args(args.agent_arg)
    if args.agent.strip() == "chat":
        kwargs.update({k: v for k, v in (("model", args.model), ("base_url", args.base_url)) if v})
        kwargs["api_key_env"] = args.api_key_env
    elif (args.model or args.base_url) and not args.agent.strip().startswith("cmd:"):
        raise UsageError("--model and --base-url are options of --agent chat and cmd:")
    return kwargs


def _model_upstream(args: argparse.Namespace) -> dict | None:
    """Issue 18: for ``--agent cmd:``, ``--base-url`` (with ``--model``, ``--api-key-env``) is the model upstream
    behind each episode's capture proxy (`EnvConfig.model_upstream`); ``None`` without it or for other agents."""
    if not args.agent.strip().startswith("cmd:") or not args.base_url:
        if args.agent.strip().startswith("cmd:") and args.model:
            raise UsageError("--model needs --base-url for --agent cmd:")
        return None
    return {"base_url": args.base_url, "model": args.model, "api_key_env": args.api_key_env}


def _cmd_run(args: argparse.Namespace) -> int:
    """Run K rollouts of every task with an agent; results in --out (see harbor_gym.run)."""
    from harbor_gym.config import EnvConfig
    from harbor_gym.errors import DatasetError, TaskLoadError
    from harbor_gym.run import RunOptions, load_targets, resolve_agent, run_rollouts
    from harbor_gym.run.progress import RichProgress, summary_table

    agent_args = _agent_args(args)
    agent = resolve_agent(args.agent, agent_args)
    if args.engine and args.backend not in ("auto", "docker"):
        raise UsageError(f"--engine names Docker engines; --backend {args.backend} cannot use them")
    config = EnvConfig.coerce({"backend": "docker" if args.engine else _engine_backend(args.backend, "run"),
                               "engines": list(args.engine), "labels": _parse_labels(args.label),
                               "semantics": args.semantics, "retry_agent_outages": args.retry_agent_outages,
                               "model_upstream": _model_upstream(args)})  # a bad --base-url: ConfigError, exit 2
    if args.engine:
        _say(_err, "", f"harbor-gym run: {len(args.engine)} engine(s), least in-flight episodes first: "
                       + ", ".join(args.engine))
    try:
        targets = load_targets(args.path, config)
    except (TaskLoadError, DatasetError) as exc:  # the one task, the dataset's settings, its registry: nothing runs
        raise UsageError(str(exc)) from exc
    out = Path(args.out)
    for task_id, error in targets.failures.items():
        _say(_err, "", f"harbor-gym run: task {task_id} failed to load, skipped: {error}")
    from harbor_gym.run.identity import check_resume, run_identity, write_identity

    # issue 15: never resume into a folder another agent, seed, semantics, config or task version wrote
    identity = run_identity(agent=agent.label, agent_args=agent_args, seed=args.seed, semantics=args.semantics,
                            config=config, tasks=targets.tasks)
    for warning in check_resume(out, identity, force=args.force_resume):
        _say(_err, "", f"harbor-gym run: warning: {warning}")
    write_identity(out, identity)
    from harbor_gym.sandbox.pool import close_pools, pool_factory

    if args.pool_size < 0:
        raise UsageError(f"--pool-size must be >= 0, got {args.pool_size}")
    # Sandboxes through the warm pools (harbor_gym.sandbox.pool): --pool-size N started ahead per spec; the
    # teardown of an ended episode's sandbox always runs in the background.
    options = RunOptions(agent=agent, out=out, rollouts_per_task=args.rollouts_per_task,
                         concurrency=args.concurrency, retries=args.retries, seed=args.seed, config=config,
                         sandbox_factory=pool_factory(config, size=args.pool_size),
                         save_trajectories=args.save_trajectories)
    try:
        report = run_rollouts(targets, options, RichProgress(_err))
    finally:
        close_pools()
    table = _plain_when_piped(summary_table(report.summaries, report.load_failures))
    # piped: a console as wide as the table needs (rich caps every print at its console's width, 80 off a terminal)
    (_out if _out.is_terminal else Console(file=_out.file, width=1000, highlight=False)).print(table)
    _say(_out, "", f"results: {out / 'rollouts.jsonl'} ({report.graded} graded this run), "
               f"{out / 'rollouts_failures.jsonl'} ({report.failed} failed this run), per-turn logs in {out / 'logs'}")
    if report.interrupted:
        _say(_err, "", f"harbor-gym run: interrupted; finished results kept in {out}; run again with --out {out} "
                   "to resume")
    return report.exit_code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harbor-gym", description="Harbor task folders as Gymnasium envs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (INFO)")
    parser.add_argument("--version", action="version", version=f"harbor-gym {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run a task or dataset with an agent; rollout files, progress, summary",
        description="Run K rollouts of every task under PATH with an agent, C at a time. Results go to --out: "
                    "rollouts.jsonl (graded episodes), rollouts_failures.jsonl (ungraded/masked episodes, tasks "
                    "that failed to load) and logs/<task>/rollout-<k>/ (per-turn verifier output, agent output, "
                    "artifacts). A second run with the same --out resumes, skipping finished episodes.",
        epilog="Exit codes: 0 every episode graded (whatever its reward); 1 some episode failed (ungraded, masked, "
               "retries exhausted) or a task of the dataset failed to load; 2 bad usage or input (not a task, "
               "unknown agent, the task fails to load); 130 interrupted (Ctrl-C: sandboxes removed, finished "
               "results kept).")
    run.add_argument("path", metavar="PATH", help="a task folder or a folder of task folders")
    run.add_argument("--agent", default="oracle", metavar="SPEC",
                     help="oracle (default) | script:FILE (FILE's text every turn; a folder: <step_name>.sh, else "
                          "default.sh, else ':') | module:Class (imported, made with the --agent-arg arguments, has "
                          "run(turn)) | cmd:\"COMMAND\" (CommandAgent: an installed harness, COMMAND run in the "
                          "sandbox every turn, {instruction} replaced by the shell-quoted instruction; with "
                          "--base-url its model calls go through a capture proxy into the records) | chat "
                          "(ChatAgent: a model behind an OpenAI-compatible endpoint, with --model and --base-url)")
    run.add_argument("--model", metavar="NAME", help="chat: the model name the server serves; cmd: forced on "
                                                     "every call of the harness")
    run.add_argument("--base-url", metavar="URL", help="chat: the endpoint, e.g. http://127.0.0.1:8000/v1; cmd: the "
                                                       "upstream behind the capture proxy (the harness gets the "
                                                       "proxy's URL in OPENAI_BASE_URL/ANTHROPIC_BASE_URL)")
    run.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                     help="chat, cmd: the environment variable holding the API key (default OPENAI_API_KEY; unset: "
                          "no key, as local servers need); the key is never taken from the command line and never "
                          "reaches a sandbox")
    run.add_argument("--agent-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="a constructor argument of the agent (module:Class, chat), repeatable; VALUE is read as "
                          "JSON when it parses (3, 0.5, true, {...}), else as a string; e.g. max_steps=20")
    run.add_argument("--save-trajectories", action="store_true",
                     help="also write OUT/trajectories.jsonl: each turn's agent outcome and model calls (token ids, "
                          "logprobs) beside the rows (format: harbor_gym.run.trajectories)")
    run.add_argument("--backend", choices=["auto", "docker", "podman", "local"], default="auto",
                     help="docker (an engine must answer, else exit 2), podman (its socket found or its service started), "
                          "local (bubblewrap), or auto (default: docker "
                          "when an engine answers, else local, announced in one line)")
    run.add_argument("--engine", action="append", default=[], metavar="URL",
                     help="a Docker engine to spread episodes over (unix://, tcp://, ssh://; repeat for several; "
                          "EnvConfig.engines); default: the one DOCKER_HOST names")
    run.add_argument("--semantics", choices=["seed", "harbor"], default="seed",
                     help="SPEC §14: seed (default) or harbor (Harbor 0.25's side)")
    run.add_argument("--rollouts-per-task", "-k", type=int, default=1, metavar="K")
    run.add_argument("--concurrency", "-c", type=int, default=1, metavar="C", help="episodes at a time")
    run.add_argument("--retries", type=int, default=2, metavar="R",
                     help="retries of a retryable failure (outage, deadline) per episode (default 2)")
    run.add_argument("--retry-agent-outages", action="store_true",
                     help="also retry outages the agent caused (its sandbox died, ran out of memory, pids or storage, "
                          "or it killed the harness's processes; GYM-12); default: a failed rollout, not retried")
    run.add_argument("--out", default="harbor-gym-results", metavar="DIR",
                     help="results folder (default ./harbor-gym-results)")
    run.add_argument("--seed", type=int, default=0, metavar="S", help="base seed of the per-episode seeds")
    run.add_argument("--force-resume", action="store_true",
                     help="resume into an --out whose run.json records a different run (agent, its arguments, seed, "
                          "semantics, config or task contents); without it such a resume is refused, saying what "
                          "differs")
    run.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="extra label on every container (repeatable)")
    run.add_argument("--pool-size", type=int, default=0, metavar="N",
                     help="warm sandboxes kept per sandbox spec (e.g. C); 0: each reset starts its own (default)")
    run.set_defaults(func=_cmd_run)

    prewarm = sub.add_parser(
        "prewarm", help="build and cache every task's image, then check that warm sandboxes start",
        description="Build (and cache) the image of every task under PATH, fill a warm pool of --size sandboxes for "
                    "each and print how long that took, then remove every sandbox it started. What lasts after it "
                    "exits is the image build cache (see `harbor-gym images`; `harbor-gym gc --images` removes it), "
                    "not the sandboxes: a warm pool lives inside one process (EnvConfig.pool_size, "
                    "`harbor-gym run --pool-size`).")
    prewarm.add_argument("path", metavar="PATH", help="a task folder or a folder of task folders")
    prewarm.add_argument("--size", type=int, default=2, metavar="N", help="sandboxes per pool (default 2)")
    prewarm.add_argument("--backend", choices=["auto", "docker", "podman", "local"], default="auto")
    prewarm.add_argument("--timeout", type=float, default=600.0, metavar="S", help="bound of each pool's fill")
    prewarm.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                         help="extra label on every container (repeatable)")
    prewarm.set_defaults(func=_cmd_prewarm)

    check = sub.add_parser("check", help="load task folders and print each problem")
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="a task folder, a folder of task folders, or a dataset NAME@VERSION of the registry")
    check.add_argument("--semantics", choices=["seed", "harbor"], default=None,
                       help="load under one side of SPEC §14; default: both, one line each where they differ")
    check.set_defaults(func=_cmd_check)

    validate = sub.add_parser("validate", help="run the oracle through every step; every turn must score 1.0")
    validate.add_argument("paths", nargs="+", metavar="PATH",
                          help="a task folder, a folder of task folders, or a dataset NAME@VERSION of the registry")
    validate.add_argument("--backend", choices=["auto", "docker", "podman", "local"], default="auto")
    validate.add_argument("--semantics", choices=["seed", "harbor"], default="seed",
                          help="SPEC §14: seed (default) or harbor")
    validate.set_defaults(func=_cmd_validate)

    images = sub.add_parser("images", help="show image aliases, pull policy and cached build images")
    images.set_defaults(func=_cmd_images)

    gc = sub.add_parser("gc", help="remove sandboxes, networks and volumes that crashed runs left behind")
    gc.add_argument("--images", action="store_true", help="also remove harbor_gym's cached build images")
    gc.add_argument("--engine", action="append", default=[], metavar="URL",
                    help="collect on this Docker engine instead of DOCKER_HOST's (repeat for several); a remote one "
                         "(tcp://, ssh://) is judged by the leases in its reaper, so other hosts' live runs stay")
    gc.set_defaults(func=_cmd_gc)
    return parser


def _version() -> str:
    from harbor_gym import __version__

    return __version__


def _sigterm_as_interrupt() -> None:
    """SIGTERM (a scheduler, ``kill``, a container stop) takes the Ctrl-C path: sandboxes removed, finished results
    kept. Python's default for SIGTERM ends the process at once, leaving sandboxes to their lease."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``harbor-gym``; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], int] = args.func
    _sigterm_as_interrupt()
    try:
        return command(args)
    except (UsageError, ConfigError) as exc:
        _say(_err, "", f"harbor-gym {args.command}: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say(_err, "", f"harbor-gym {args.command}: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
