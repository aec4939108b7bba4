"""The ``harbor-gym`` command line: check, validate, images, gc.

Exit codes, for every command: 0 all good; 1 something checked failed; 2 bad usage or input that cannot be read
(a path that is neither a task folder nor a folder of task folders, an unreadable settings file).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Sequence

from rich.console import Console

from harbor_gym.errors import ConfigError, HarborGymError

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


class UsageError(Exception):
    """Bad usage or unreadable input: exit code 2 with a one-line message."""


def _is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file()


def _task_targets(paths: Sequence[str]):
    """Yield ``(task_id, loader)`` for every task under ``paths``; a loader returns a Task or raises TaskLoadError.

    A path holding ``task.toml`` is one task; any other folder is a dataset of task folders.

    Raises:
        UsageError: a path does not exist or is not a folder.
    """
    from harbor_gym.errors import TaskLoadError
    from harbor_gym.task import load_dataset, load_task

    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{raw}: no such file or folder")
        if not path.is_dir():
            raise UsageError(f"{raw}: not a task folder or a folder of task folders")
        if _is_task_folder(path):
            yield path.resolve().name, (lambda p=path: load_task(p))
            continue
        try:
            dataset = load_dataset(path)
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


def _cmd_check(args: argparse.Namespace) -> int:
    """Load every task; print one line per task: OK, or the problem (SPEC §3 LOAD rules)."""
    failed = 0
    for task_id, load in _task_targets(args.paths):
        try:
            task = load()
        except HarborGymError as exc:
            failed += 1
            _out.print(f"[red]FAIL[/red] {task_id}: {exc}")
            continue
        _out.print(f"[green]OK[/green]   {task_id} ({len(task.steps)} step{'s' if len(task.steps) != 1 else ''})")
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    """Run the oracle through every step of every task (ORACLE-3/4); name each failing step."""
    from harbor_gym.config import EnvConfig
    from harbor_gym.episode import validate

    config = EnvConfig(backend=args.backend)
    failed = 0
    for task_id, load in _task_targets(args.paths):
        try:
            task = load()
            report = validate(task, config=config)
        except HarborGymError as exc:
            failed += 1
            _out.print(f"[red]FAIL[/red] {task_id}: {exc}")
            continue
        if report.passed:
            rewards = ", ".join(f"{s.name}={s.reward:g}" for s in report.steps)
            _out.print(f"[green]PASS[/green] {task_id}: {rewards}")
        else:
            failed += 1
            _out.print(f"[red]FAIL[/red] {task_id}: {report.summary()}")
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_images(args: argparse.Namespace) -> int:
    """Show the alias tables, the pull policy and the cached build images."""
    from harbor_gym.config import EnvConfig, settings_path

    config = EnvConfig()
    _out.print(f"settings file: {settings_path()}")
    _out.print(f"pull policy:   {config.effective_pull_policy().value}")
    for public, local in sorted(config.effective_image_aliases().items()):
        _out.print(f"alias  {public} -> {local}")
    for image, folder in sorted(config.effective_rootfs_aliases().items()):
        _out.print(f"rootfs {image} -> {folder}")
    try:
        from harbor_gym.sandbox.images import list_cached_images
    except ImportError:
        return EXIT_OK
    try:
        for line in list_cached_images():
            _out.print(f"cached {line}")
    except HarborGymError as exc:
        _err.print(f"harbor-gym images: cannot list cached images: {exc}")
        return EXIT_FAILED
    return EXIT_OK


def _cmd_gc(args: argparse.Namespace) -> int:
    """Remove what crashed runs left behind (labelled, lease expired): Docker resources and local sandboxes;
    with --images also the build cache. Resources of live runs are never touched."""
    from harbor_gym.errors import SandboxUnavailableError
    from harbor_gym.sandbox.gc import collect_garbage
    from harbor_gym.sandbox.local import collect_local_garbage

    status = EXIT_OK
    try:
        report = collect_garbage(images=args.images)
    except SandboxUnavailableError as exc:
        _out.print(f"docker: skipped ({exc})")
    else:
        for kind in ("containers", "networks", "volumes", "images"):
            names = getattr(report, kind)
            _out.print(f"docker {kind}: {len(names)} removed" + (f" ({', '.join(names)})" if names else ""))
        _out.print(f"docker: {len(report.kept_live)} kept (their runs are live)")
        for error in report.errors:
            _err.print(f"harbor-gym gc: {error}")
            status = EXIT_FAILED
    removed = collect_local_garbage()
    _out.print(f"local sandboxes: {len(removed)} removed" + (f" ({', '.join(removed)})" if removed else ""))
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harbor-gym", description="Harbor task folders as Gymnasium envs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="load task folders and print each problem")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a task folder or a folder of task folders")
    check.set_defaults(func=_cmd_check)

    validate = sub.add_parser("validate", help="run the oracle through every step; every turn must score 1.0")
    validate.add_argument("paths", nargs="+", metavar="PATH", help="a task folder or a folder of task folders")
    validate.add_argument("--backend", choices=["auto", "docker", "local"], default="auto")
    validate.set_defaults(func=_cmd_validate)

    images = sub.add_parser("images", help="show image aliases, pull policy and cached build images")
    images.set_defaults(func=_cmd_images)

    gc = sub.add_parser("gc", help="remove sandboxes, networks and volumes that crashed runs left behind")
    gc.add_argument("--images", action="store_true", help="also remove harbor_gym's cached build images")
    gc.set_defaults(func=_cmd_gc)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``harbor-gym``; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except (UsageError, ConfigError) as exc:
        _err.print(f"harbor-gym {args.command}: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err.print(f"harbor-gym {args.command}: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
