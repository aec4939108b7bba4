#!/bin/bash
set -euo pipefail
echo 1 > /app/counter.txt
