"""README.md stays true: its Python example runs as printed and reaches the episode's roll-up."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.docker


def test_readme_python_example_runs():
    text = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(import gymnasium.*?)```", text, re.S)
    assert block, "README.md lost its Python example"
    proc = subprocess.run([sys.executable, "-c", block.group(1)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["01-select-cake-base 1.0", "02-select-frosting 1.0", "episode: 1.0"]
