#!/bin/bash
# Step set-up (TURN-5), run as `bash /app/setup.sh` in /app by the step's agent user before the healthcheck.
# It starts the status service and returns at once: setsid puts the server in its own session and the redirections
# close the exec's output pipes, so the server keeps running after this script and the turn end (TURN-10, TURN-6).
set -euo pipefail
setsid python3 -m http.server 8080 --bind 127.0.0.1 --directory /app/site \
  </dev/null >/tmp/status-server.log 2>&1 &
echo "status service started (pid $!)"
