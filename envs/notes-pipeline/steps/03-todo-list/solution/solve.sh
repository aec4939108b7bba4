#!/bin/bash
set -euo pipefail
sed -n 's/^TODO: //p' /app/all-notes.txt | LC_ALL=C sort > /app/report/todo.txt
