"""notebooks/quickstart.ipynb runs top to bottom on the Docker backend, and its learning loop learns.

The notebook's last cell prints a JSON summary; the learning loop (fixed seed, capped episodes) must end with a
success rate of at least 0.9 and above its initial rate, and leave no container behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import IN_CI

pytestmark = pytest.mark.docker

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"
LABEL = ("io.harbor-gym.test", "notebook-" + uuid.uuid4().hex[:12])


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        if IN_CI:
            pytest.fail(f"CI=true but {module} is missing (pip install -e '.[notebook]')")
        pytest.skip(f"{module} is missing (pip install -e '.[notebook]')")


def _ensure_kernel() -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", "python3"], check=True,
                       capture_output=True, timeout=120)


def test_quickstart_notebook_runs_and_its_policy_learns(monkeypatch, docker_client):
    # SPEC: GYM-3, GYM-6, GYM-8 (stepping, info records, roll-up); the learning loop uses turn rewards only.
    nbformat = _require("nbformat")
    nbclient = _require("nbclient")
    for module in ("ipykernel", "matplotlib"):
        _require(module)
    _ensure_kernel()
    monkeypatch.setenv("QUICKSTART_LABELS", json.dumps(dict([LABEL])))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()  # raises CellExecutionError naming the failing cell
    finally:
        left = docker_client.api.containers(all=True, filters={"label": "=".join(LABEL)})
        for c in left:
            docker_client.api.remove_container(c["Id"], force=True)
    assert left == [], f"containers left behind: {[c['Names'] for c in left]}"
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.get("name") == "stdout")
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["episodes"] <= 30
    assert summary["final_success"] >= 0.9
    assert summary["final_success"] > summary["initial_success"]
    assert summary["greedy_reward"] == 1.0
    # the earlier cells showed a plot and a table
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert any("text/html" in o.get("data", {}) for o in outputs)
