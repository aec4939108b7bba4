#!/bin/bash
# Task-level solution: used only by steps without their own steps/<name>/solution/ folder (ORACLE-1); here that is
# 03-double.
set -euo pipefail
n=$(cat /app/counter.txt)
echo $((n * 2)) > /app/counter.txt
