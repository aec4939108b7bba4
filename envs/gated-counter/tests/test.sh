#!/bin/bash
# Shared verifier of every step (no step has its own tests/test.sh, so this one runs: VER-8).
# $EXPECTED comes from the step's [steps.verifier].env. Reward 1 or 0 in reward.txt; the exit code never counts (VER-9).
mkdir -p /logs/verifier
actual="$(cat /app/counter.txt 2>/dev/null)"
if [ -n "${EXPECTED:-}" ] && [ "$actual" = "$EXPECTED" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected /app/counter.txt to hold '${EXPECTED:-?}', found '${actual}'"
  echo 0 > /logs/verifier/reward.txt
fi
