"""`JsonlFile`: whole rows only, thread-safe appends, a torn tail repaired; `RolloutFiles.done_keys` for resume."""

from __future__ import annotations

import json
import threading

from harbor_gym.run import FailureRow, JsonlFile, RolloutFiles


def test_appends_are_whole_lines_under_threads(tmp_path):
    file = JsonlFile(tmp_path / "rows.jsonl")
    big = "x" * 200_000  # larger than a pipe buffer: still one write

    def writer(n: int) -> None:
        for i in range(20):
            file.append({"writer": n, "i": i, "pad": big})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 80
    assert sorted((r["writer"], r["i"]) for r in map(json.loads, lines)) == [(n, i) for n in range(4) for i in range(20)]


def test_torn_last_line_is_skipped_on_read_and_cut_before_the_next_append(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2, "b"')  # a crash outside our control left half a row
    file = JsonlFile(path)
    assert list(file.rows()) == [{"a": 1}]
    file.append({"a": 3})
    assert path.read_text() == '{"a": 1}\n{"a":3}\n'
    assert list(JsonlFile(path).rows()) == [{"a": 1}, {"a": 3}]


def test_missing_file_reads_as_empty(tmp_path):
    assert list(JsonlFile(tmp_path / "none.jsonl").rows()) == []


def test_done_keys_cover_both_files_but_not_load_failures(tmp_path):
    files = RolloutFiles(tmp_path)
    files.rollouts.append({"task_id": "a", "rollout": 0})
    files.write(FailureRow(task_id="b", rollout=1, seed=3, agent="oracle", reason="outage", failure_kind="x",
                           retryable=True))
    files.write(FailureRow(task_id="c", rollout=None, seed=None, agent="oracle", reason="LOAD-1",
                           failure_kind="harbor_gym:task_load_failed"))
    assert files.done_keys() == {("a", 0), ("b", 1)}
    assert (tmp_path / "rollouts_failures.jsonl").read_text().count("\n") == 2
