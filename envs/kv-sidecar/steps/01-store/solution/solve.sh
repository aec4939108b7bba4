#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import urllib.request

for key, value in (("color", "blue"), ("size", "large")):
    req = urllib.request.Request(f"http://kv:8000/kv/{key}", data=value.encode(), method="PUT")
    urllib.request.urlopen(req, timeout=5).close()
PY
