"""Write the store's current content, sorted, to the file named by argv[1] (the task's collect hook)."""

import json
import os
import sys

store_path = os.path.join(os.environ.get("KV_DATA", "/data"), "store.json")
with open(store_path, encoding="utf-8") as f:
    store = json.load(f)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(store, f, indent=2, sort_keys=True)
    f.write("\n")
