#!/bin/bash
# Step set-up (TURN-5): merged into /app with the rest of workdir/ and run as `bash /app/setup.sh` in /app, as the
# step's agent user ("agent"), before the agent. A non-zero exit fails the step's preparation (TURN-8).
set -euo pipefail
mkdir -p /app/report
echo "Reports of the notes pipeline, folder created by setup.sh as $(id -un)." > /app/report/README.txt
