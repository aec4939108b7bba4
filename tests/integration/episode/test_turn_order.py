"""TURN-3: preparation runs in order — user switch, workdir merge, setup.sh, healthcheck, then the oracle's
solution — each phase seeing what the earlier ones did."""

from __future__ import annotations

import pytest

from harbor_gym.agents import Oracle

from .conftest import BACKENDS, run_episode, toml, write_task

STEP = '''name = "ordered"
[steps.agent]
user = "nobody"
[steps.verifier]
timeout_sec = 10
[steps.healthcheck]
command = "touch /tmp/hc-ran && test -f /tmp/setup-done"
interval_sec = 0.2
timeout_sec = 5
retries = 2
'''

SETUP = """#!/bin/bash
# Runs after the user switch (USR-2) and the workdir merge (TURN-4).
{ id -un; test -f merged.txt && echo merged-before-setup; } > /tmp/setup.log
touch /tmp/setup-done
"""

SOLVE = """#!/bin/bash
# The oracle's solution comes last: after the healthcheck ran.
{ id -un; test -f /tmp/hc-ran && echo healthcheck-before-solution; } > /tmp/solve.log
"""

CHECK = """#!/bin/bash
ok=1
grep -qx nobody /tmp/setup.log || ok=0
grep -qx merged-before-setup /tmp/setup.log || ok=0
grep -qx nobody /tmp/solve.log || ok=0
grep -qx healthcheck-before-solution /tmp/solve.log || ok=0
echo $ok > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_3_preparation_order(tmp_path, backend):
    # SPEC: TURN-3 (with USR-2, TURN-4, TURN-5, TURN-7, ORACLE-1)
    task = write_task(tmp_path, {
        "task.toml": toml([STEP]),
        "steps/ordered/workdir/merged.txt": "from the step's workdir/\n",
        "steps/ordered/workdir/setup.sh": SETUP,
        "steps/ordered/solution/solve.sh": SOLVE,
        "steps/ordered/tests/test.sh": CHECK,
    })
    results, final = run_episode(task, Oracle(), backend=backend)
    record = results[0].record
    assert record.failure_kind is None, record
    assert record.reward == 1.0 and final.reward == 1.0
