#!/bin/bash
set -euo pipefail
cat /app/notes/*.txt > /app/all-notes.txt
