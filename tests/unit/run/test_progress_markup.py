"""The live progress and the summary print what tasks and sandboxes wrote verbatim, never as rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from harbor_gym.run.progress import RichProgress, summary_table


class _Failed:
    reason = "build failed: RUN echo '[/bold] [link=file:///etc/shadow]x'"


def test_a_failure_reason_quoting_a_build_log_is_printed_verbatim():
    # GYM-10: a task's build log (quoted in the reason) cannot crash the run's display with malformed markup
    console = Console(file=io.StringIO(), width=200)
    progress = RichProgress(console)
    progress.started(1, 0)
    progress.episode_started("t", 0)
    progress.episode_done("t[x]", 0, _Failed())
    progress._progress.stop()
    assert "t[x] rollout 0: build failed: RUN echo '[/bold] [link=file:///etc/shadow]x'" in console.file.getvalue()


def test_a_task_id_with_brackets_survives_the_summary():
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table([], {"odd[red]": "x"}))
    assert "odd[red]" in console.file.getvalue()
