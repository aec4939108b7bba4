#!/bin/bash
set -euo pipefail
grep -c '^TODO:' /app/all-notes.txt > /app/report/todo-count.txt
