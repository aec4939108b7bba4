"""A tiny HTTP key-value store (stdlib only): GET/PUT/DELETE /kv/<key>, GET /health.

Values are kept in $KV_DATA/store.json; every request is appended to $KV_DATA/log.txt.
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DATA = os.environ.get("KV_DATA", "/data")
STORE = os.path.join(DATA, "store.json")
LOG = os.path.join(DATA, "log.txt")
LOCK = threading.Lock()


def load():
    try:
        with open(STORE, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save(store):
    tmp = STORE + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(store, f, sort_keys=True)
    os.replace(tmp, STORE)


class Handler(BaseHTTPRequestHandler):
    def _reply(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _key(self):
        return self.path[len("/kv/"):] if self.path.startswith("/kv/") and len(self.path) > 4 else None

    def _log(self, what):
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(what + "\n")

    def do_GET(self):
        if self.path == "/health":
            return self._reply(200, b"ok\n")
        key = self._key()
        with LOCK:
            store = load()
            self._log(f"GET {key}")
        if key is None or key not in store:
            return self._reply(404, b"no such key\n")
        return self._reply(200, store[key].encode("utf-8"))

    def do_PUT(self):
        key = self._key()
        if key is None:
            return self._reply(400, b"PUT /kv/<key>\n")
        length = int(self.headers.get("Content-Length") or 0)
        value = self.rfile.read(length).decode("utf-8")
        with LOCK:
            store = load()
            store[key] = value
            save(store)
            self._log(f"PUT {key}={value}")
        return self._reply(204)

    def do_DELETE(self):
        key = self._key()
        with LOCK:
            store = load()
            found = store.pop(key, None) is not None
            save(store)
            self._log(f"DELETE {key}")
        return self._reply(204 if found else 404)

    def log_message(self, *args):  # keep the container log quiet; the store has its own log
        pass


if __name__ == "__main__":
    os.makedirs(DATA, exist_ok=True)
    with LOCK:
        if not os.path.exists(STORE):
            save({})
        open(LOG, "a").close()
    ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("KV_PORT", "8000"))), Handler).serve_forever()
