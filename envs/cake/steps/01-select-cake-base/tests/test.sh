#!/bin/bash
# Verifier of step 01-select-cake-base. Only /logs/verifier/reward.txt counts, never this script's exit code (VER-9).
mkdir -p /logs/verifier
if [ "$(cat /app/cake/base.txt 2>/dev/null)" = "chocolate" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "expected /app/cake/base.txt to hold 'chocolate'"
  echo 0 > /logs/verifier/reward.txt
fi
