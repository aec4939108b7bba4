#!/bin/bash
# Verifier of 02-combine: the label must be in the sidecar and in /app/label.txt.
mkdir -p /logs/verifier
python3 - <<'PY' || echo 0 > /logs/verifier/reward.txt
import urllib.error
import urllib.request

try:
    with urllib.request.urlopen("http://kv:8000/kv/label", timeout=5) as r:
        stored = r.read().decode()
except urllib.error.HTTPError:
    stored = None
try:
    written = open("/app/label.txt", encoding="utf-8").read()
except OSError:
    written = None
print(f"kv label={stored!r} /app/label.txt={written!r}")
ok = stored == "large-blue" and written == "large-blue\n"
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\n" if ok else "0\n")
PY
