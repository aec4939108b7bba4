#!/bin/bash
# Verifier of 01-gather: /app/all-notes.txt must equal the fixture (this folder is uploaded to /tests).
source /tests/lib.sh
reward_if_same /app/all-notes.txt /tests/expected-all-notes.txt
