"""GYM-10, issue 12 item 3: a compose bind mount of a task-folder path is read-only or a copy, so that no sandbox
process, root included, writes into the downloaded task folder on the host."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.sandbox.base import SandboxSettings
from harbor_gym.sandbox.compose import open_group
from harbor_gym.task.compose import parse_compose_file

from .helpers import LABEL

pytestmark = pytest.mark.docker

COMPOSE = """services:
  main:
    image: harbor-gym/base:bookworm
    volumes:
      - ./conf:/etc/app:ro
      - type: bind
        source: ./data
        target: /data
        read_only: true
      - ./seed:/seed
      - ./one.txt:/one.txt
"""

ATTACK = r"""
for t in /etc/app /data; do
  echo pwned > $t/new.txt 2>/dev/null && echo "wrote $t/new.txt"
  echo pwned >> $t/file.txt 2>/dev/null && echo "appended $t/file.txt"
  rm -f $t/file.txt 2>/dev/null && [ ! -e $t/file.txt ] && echo "removed $t/file.txt"
  mkdir $t/dir 2>/dev/null && echo "mkdir $t/dir"
  mount -o remount,rw $t 2>/dev/null && echo "remounted $t"
  ln -s /etc/shadow $t/link 2>/dev/null && echo "linked $t/link"
  chmod 777 $t 2>/dev/null && echo "chmod $t"
done
echo pwned > /seed/new.txt && echo pwned >> /seed/file.txt && rm -f /seed/gone.txt && echo pwned > /one.txt
echo done
"""


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash (or mode for folders and links)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_dir():
            out[rel] = f"dir:{path.stat().st_mode:o}"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() + f":{path.stat().st_mode:o}"
    return out


# SPEC: GYM-10 (a compose bind of a task-folder path is read-only or a copy: the task folder on the host is unchanged
# whatever a root process in the sandbox does)
def test_gym_10_compose_binds_cannot_write_into_the_task_folder(tmp_path):
    env = tmp_path / "task" / "environment"
    for rel, text in {"conf/file.txt": "conf\n", "data/file.txt": "data\n", "seed/file.txt": "seed\n",
                      "seed/gone.txt": "keep\n", "one.txt": "one\n"}.items():
        (env / rel).parent.mkdir(parents=True, exist_ok=True)
        (env / rel).write_text(text)
    (env / "docker-compose.yaml").write_text(COMPOSE)
    before = _snapshot(tmp_path / "task")
    cfg = EnvConfig(backend="docker", labels=dict([LABEL]))
    group = open_group(parse_compose_file(env / "docker-compose.yaml"), backend="docker",
                       settings=SandboxSettings.from_config(cfg), labels=dict([LABEL]), name_hint="binds")
    try:
        res = group.main.exec(ATTACK, user="root", timeout=60)
        assert res.stdout.strip().endswith("done"), res
        assert res.stdout.strip() == "done", f"a write into a read-only bind succeeded: {res.stdout}"
        # the read-write binds were copies: the sandbox sees its own writes
        assert group.main.read_file("/seed/new.txt", max_bytes=100) == b"pwned\n"
        assert group.main.read_file("/one.txt", max_bytes=100) == b"pwned\n"
    finally:
        group.stop()
    assert _snapshot(tmp_path / "task") == before
