#!/bin/bash
# Verifier of 01-store: asks the sidecar itself (from main, by its service name) for both keys.
mkdir -p /logs/verifier
python3 - <<'PY' || echo 0 > /logs/verifier/reward.txt
import urllib.error
import urllib.request


def get(key):
    try:
        with urllib.request.urlopen(f"http://kv:8000/kv/{key}", timeout=5) as r:
            return r.read().decode()
    except urllib.error.HTTPError:
        return None


found = {key: get(key) for key in ("color", "size")}
print(f"kv holds {found}")
ok = found == {"color": "blue", "size": "large"}
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\n" if ok else "0\n")
PY
