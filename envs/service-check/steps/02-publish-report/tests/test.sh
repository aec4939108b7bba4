#!/bin/bash
# Verifier of 02-publish-report: the service started by turn 1's setup.sh must still run and serve the report,
# byte for byte what /app/report.txt holds.
mkdir -p /logs/verifier
python3 - <<'PY' || echo '{"reward": 0.0, "served": 0.0}' > /logs/verifier/reward.json
import json, urllib.request
try:
    expected = open("/app/report.txt", encoding="utf-8").read()
except OSError as exc:
    print(f"cannot read /app/report.txt: {exc}")
    expected = ""
try:
    body = urllib.request.urlopen("http://127.0.0.1:8080/report.txt", timeout=5).read().decode()
except Exception as exc:
    print(f"cannot fetch the report from the service: {exc!r}")
    body = None
served = 1.0 if expected and body == expected else 0.0
print(f"served body={body!r} served={served}")
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": served, "served": served}, f)
PY
