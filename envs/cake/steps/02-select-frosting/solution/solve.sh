#!/bin/bash
# Reference solution of step 02-select-frosting.
set -euo pipefail
echo vanilla-buttercream > /app/cake/frosting.txt
