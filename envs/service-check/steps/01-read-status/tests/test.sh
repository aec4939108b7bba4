#!/bin/bash
# Verifier of 01-read-status. It only reads /app/report.txt, which is also a step artifact, so it gives the same
# result in a separate verifier sandbox that receives the artifacts (VER-2, VER-5).
mkdir -p /logs/verifier
python3 - <<'PY' || echo '{"reward": 0.0, "correct": 0.0, "style": 0.0}' > /logs/verifier/reward.json
import json
try:
    text = open("/app/report.txt", encoding="utf-8").read()
except OSError as exc:
    print(f"cannot read /app/report.txt: {exc}")
    text = ""
lines = text.splitlines()
correct = 1.0 if lines and lines[0].strip() == "version=2.4.1" else 0.0
style = 1.0 if len(lines) == 1 and text.endswith("\n") else 0.0
print(f"report={text!r} correct={correct} style={style}")
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": (correct + style) / 2, "correct": correct, "style": style}, f)
PY
