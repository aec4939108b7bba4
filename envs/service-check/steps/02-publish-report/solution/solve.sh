#!/bin/bash
set -euo pipefail
cp /app/report.txt /app/site/report.txt
