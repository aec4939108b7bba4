"""`RichProgress`: the live display of ``harbor-gym run`` (episodes done, running, failed, mean reward so far, time
left) and `summary_table`, the per-task table printed at the end."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from harbor_gym.run.rows import RolloutRow
from harbor_gym.run.runner import RunReport
from harbor_gym.run.summary import TaskSummary

__all__ = ["RichProgress", "summary_table"]


class RichProgress:
    """A `RunListener` drawing one live progress line on ``console`` (thread-safe)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()
        self._running = 0
        self._failed = 0
        self._retries = 0
        self._rewards: list[float] = []
        self._progress = Progress(
            TextColumn("[bold]episodes"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            refresh_per_second=4,
        )
        self._task = None

    def _status(self) -> str:
        mean = f"{sum(self._rewards) / len(self._rewards):.3f}" if self._rewards else "-"
        retries = f" retries {self._retries}" if self._retries else ""
        return f"running {self._running}  failed {self._failed}  mean reward {mean}{retries}"

    def _update(self, advance: int = 0) -> None:
        if self._task is not None:
            self._progress.update(self._task, advance=advance, status=self._status())

    def started(self, total: int, skipped: int) -> None:
        self._task = self._progress.add_task("run", total=total, completed=skipped, status="")
        self._update()
        self._progress.start()
        if skipped:
            self.console.print(f"resuming: {skipped} episode(s) already in the results folder are skipped")

    def episode_started(self, task_id: str, rollout: int) -> None:
        with self._lock:
            self._running += 1
            self._update()

    def episode_retry(self, task_id: str, rollout: int, attempt: int, reason: str) -> None:
        with self._lock:
            self._retries += 1
            self._update()

    def episode_done(self, task_id: str, rollout: int, row) -> None:
        with self._lock:
            self._running -= 1
            if isinstance(row, RolloutRow):
                self._rewards.append(row.reward)
            else:
                self._failed += 1
                # the reason may quote a task's own output (a build log's end): printed verbatim, never as markup
                self._progress.console.print(f"[red]failed[/red] {escape(f'{task_id} rollout {rollout}: {row.reason}')}")
            self._update(advance=1)

    def episode_abandoned(self, task_id: str, rollout: int) -> None:
        with self._lock:
            self._running -= 1
            self._update()

    def finished(self, report: RunReport) -> None:
        self._update()
        self._progress.stop()


def _fmt_reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_table(summaries: list[TaskSummary], load_failures: dict[str, str]) -> Table:
    """Per task: episodes (graded/total), mean episode reward over graded episodes and over all rollouts (failed ones
    as 0; GYM-12), per-step pass rate (turns with reward >= 1.0 over turns that ran, in graded episodes), early
    stops, agent-caused outages, failure kinds."""
    table = Table(title="harbor-gym run", show_lines=True)
    table.add_column("task", no_wrap=True)
    table.add_column("graded", justify="right")
    table.add_column("mean reward\n(graded)", justify="right")
    table.add_column("mean reward\n(all rollouts)", justify="right")
    table.add_column("per-step pass\n(passed/ran)", no_wrap=True)
    table.add_column("early\nstops", justify="right")
    table.add_column("agent\noutages", justify="right")
    table.add_column("failure kinds", overflow="fold")
    for s in summaries:
        kinds = "\n".join(f"{k} x{n}" for k, n in sorted(s.failure_kinds.items())) or "-"
        table.add_row(escape(s.task_id), f"{s.graded}/{s.episodes}", _fmt_reward(s.mean_reward),
                      _fmt_reward(s.mean_reward_all), s.step_pass_text("\n") or "-", str(s.early_stops),
                      str(s.agent_outages), kinds)
    for task_id in sorted(load_failures):
        table.add_row(escape(task_id), "not loaded", "-", "-", "-", "-", "-", "harbor_gym:task_load_failed")
    return table
