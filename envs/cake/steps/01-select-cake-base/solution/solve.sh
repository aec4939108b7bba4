#!/bin/bash
# Reference solution of step 01-select-cake-base (ORACLE-1: steps/<name>/solution/ wins over solution/).
set -euo pipefail
mkdir -p /app/cake
echo chocolate > /app/cake/base.txt
