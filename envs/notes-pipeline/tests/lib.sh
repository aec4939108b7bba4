#!/bin/bash
# Shared verifier helpers. tests/ is uploaded to /tests first, then steps/<name>/tests/ over it (VER-6), so every
# step's test.sh can source /tests/lib.sh.

# reward_if_same ACTUAL EXPECTED: write 1 to reward.txt when the two files are byte-identical, else 0 and a diff.
reward_if_same() {
  mkdir -p /logs/verifier
  if cmp -s "$1" "$2"; then
    echo 1 > /logs/verifier/reward.txt
  else
    echo "$1 differs from the expected content:"
    diff "$2" "$1" || true
    echo 0 > /logs/verifier/reward.txt
  fi
}
