#!/bin/bash
set -euo pipefail
n=$(cat /app/counter.txt)
echo $((n + 1)) > /app/counter.txt
