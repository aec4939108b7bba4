"""Fixture task folders for integration tests, written into a temporary folder from compact dicts.

Shared by the episode rule tests and the hostile suite. Fixtures use ``debian:bookworm-slim`` (aliased offline to
the local base image), ``network_mode = "no-network"`` and tiny budgets, so each episode takes a second or two.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Iterable

__all__ = ["HEAD", "REWARD_0", "REWARD_1", "WORKDIR_KEEP", "grade", "toml", "write_task"]

HEAD = """schema_version = "1.4"
{top}
[environment]
docker_image = "debian:bookworm-slim"
workdir = "/app"
network_mode = "no-network"
{env}
[agent]
timeout_sec = {agent_timeout}
"""

REWARD_0 = "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
REWARD_1 = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def grade(check: str, *, then_sleep: float = 0.0) -> str:
    """A test.sh writing reward 1 iff the shell condition ``check`` holds, else 0 (then sleeping, if asked)."""
    tail = f"sleep {then_sleep}\n" if then_sleep else ""
    return f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n{tail}"


def toml(steps: Iterable[str] = (), *, top: str = "", env: str = "", agent_timeout: float = 20,
         verifier_timeout: float = 10, tail: str = "") -> str:
    """A task.toml: the common head, then each ``[[steps]]`` body (a name, or a TOML fragment with ``=``)."""
    text = HEAD.format(top=top, env=env, agent_timeout=agent_timeout) + tail
    for step in steps:
        body = step if "=" in step else f'name = "{step}"\n[steps.verifier]\ntimeout_sec = {verifier_timeout}\n'
        text += "\n[[steps]]\n" + body + "\n"
    return text


#: The file `write_task` adds to a ``docker_image`` task without ``environment/``: it is copied into the workdir at
#: seed (FMT-10), which creates ``/app`` under both semantics, as real tasks' ``environment/`` files do (Harbor
#: semantics never create a workdir the image lacks, issue 16; the base image has no ``/app``).
WORKDIR_KEEP = "environment/.gitkeep"


def write_task(root: Path, files: dict[str, Any], name: str, *, keep_workdir: bool = True) -> Path:
    """Write the task folder ``root/name`` from ``{relpath: text | bytes | (text, mode)}``.

    ``*.sh`` files are 0755 unless a mode is given. Every step folder named by a file, and every step declared in
    task.toml, gets an ``instruction.md`` ("Do step <name>.") unless the dict gives one; the task gets a top-level
    ``instruction.md`` unless given. With ``keep_workdir`` a ``docker_image`` task naming no ``environment/`` file
    gets the empty `WORKDIR_KEEP`, so that its workdir exists under Harbor semantics too.
    """
    if keep_workdir and not any(rel.startswith("environment/") for rel in files) \
            and "docker_image" in str(files.get("task.toml", "")):
        files = {**files, WORKDIR_KEEP: ""}
    task = root / name
    for rel, content in files.items():
        data, mode = content if isinstance(content, tuple) else (content, 0o755 if rel.endswith(".sh") else 0o644)
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        os.chmod(path, mode)
    steps = {Path(rel).parts[1] for rel in files if len(Path(rel).parts) > 2 and Path(rel).parts[0] == "steps"}
    if (task / "task.toml").exists():
        try:
            steps |= {s["name"] for s in tomllib.loads((task / "task.toml").read_text()).get("steps") or []}
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, TypeError, KeyError):
            pass  # a deliberately broken task.toml: the test is about the refusal
    for step in steps:
        instr = task / "steps" / step / "instruction.md"
        if not instr.exists():
            instr.parent.mkdir(parents=True, exist_ok=True)
            instr.write_text(f"Do step {step}.\n")
    if not (task / "instruction.md").exists():
        (task / "instruction.md").write_text("Do the task.\n")
    return task
