"""Exit 0 iff the key-value service answers GET /health (the compose healthcheck of service kv)."""

import os
import sys
import urllib.request

try:
    with urllib.request.urlopen(f"http://127.0.0.1:{os.environ.get('KV_PORT', '8000')}/health", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except OSError:
    sys.exit(1)
