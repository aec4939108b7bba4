"""ART rules on real sandboxes: hooks, convention entry, task/step entries, manifest, skip and exclude."""

import json
from pathlib import Path

import pytest

from .conftest import BACKENDS, REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


def _manifest(rec):
    return json.loads((Path(rec.log_dir) / "verifier" / "artifacts" / "manifest.json").read_text())


# SPEC: ART-1, ART-3, ART-4
@pytest.mark.parametrize("backend", BACKENDS)
def test_art_1_hooks_then_entries_with_origin(tmp_path, backend):
    body = ('name = "s1"\nartifacts = [{ source = "/app/step.txt", destination = "out/step.txt" }]\n'
            '[steps.verifier]\ntimeout_sec = 10\n'
            '[[steps.verifier.collect]]\ncommand = "echo hooked > /app/hook.txt"\n'
            '[[steps.verifier.collect]]\ncommand = "exit 9"\n')
    task = write_task(tmp_path, {"task.toml": toml([body], top='artifacts = ["/app/hook.txt", "/app/missing"]'),
                                 "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, "echo c > /logs/artifacts/c.txt; echo s > /app/step.txt",
                             {"logs_root": str(tmp_path / "logs")}, backend=backend)
    rec = results[0].record
    data = _manifest(rec)
    assert [(m["source"], m["origin"], m["status"]) for m in data] == [
        ("/logs/artifacts", "convention", "ok"), ("/app/hook.txt", "task", "ok"),
        ("/app/missing", "task", "failed"), ("/app/step.txt", "step", "ok")]
    assert data == [m.to_dict() for m in rec.manifest]
    art = Path(rec.log_dir) / "verifier" / "artifacts"
    assert (art / "app" / "hook.txt").read_text() == "hooked\n"  # the hook ran before collection
    assert (art / "out" / "step.txt").read_text() == "s\n" and (art / "logs/artifacts/c.txt").is_file()
    assert rec.reward == 1.0  # a failing hook never fails the turn


# SPEC: ART-2, ART-5
def test_art_2_named_convention_entry_replaces_it_and_conflicts_skip(tmp_path):
    top = ('artifacts = [{ source = "/logs/artifacts", destination = "pub", exclude = ["*.log"] }, '
           '{ source = "/app/x", destination = "pub/x" }, { source = "/app/y.txt", destination = "y.txt" }]')
    task = write_task(tmp_path, {"task.toml": toml(["s1"], top=top), "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, "echo a > /logs/artifacts/a.txt; echo l > /logs/artifacts/b.log; "
                                   "mkdir -p /app/x; echo y > /app/y.txt", {"logs_root": str(tmp_path / "logs")})
    rec = results[0].record
    data = _manifest(rec)
    assert [(m["destination"], m["status"]) for m in data] == [("pub", "ok"), ("pub/x", "skipped"),
                                                               ("y.txt", "ok")]
    assert data[0]["origin"] == "task" and data[2]["type"] == "file"
    art = Path(rec.log_dir) / "verifier" / "artifacts"
    assert (art / "pub" / "a.txt").is_file() and not (art / "pub" / "b.log").exists()


# SPEC: ART-4
def test_art_4_empty_convention_folder(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    results, _ = run_episode(task, ":")
    assert [(m.source, m.status, m.origin) for m in results[0].record.manifest] == [
        ("/logs/artifacts", "empty", "convention")]
