#!/bin/bash
set -euo pipefail

# step: write the converter /app/ini2json.py
cat > /app/ini2json.py <<'PY'
#!/usr/bin/env python3
import json
import re
import sys


def typed(v):
    if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
        return v[1:-1]
    low = v.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if re.fullmatch(r"-?[0-9]+", v):
        return int(v)
    return v


def convert(text):
    out, sec = {}, "global"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            sec = line[1:-1].strip()
            out.setdefault(sec, {})
            continue
        cut = min(i for i in (line.find("="), line.find(":")) if i >= 0) if ("=" in line or ":" in line) else -1
        if cut < 0:
            continue
        out.setdefault(sec, {})[line[:cut].strip().lower()] = typed(line[cut + 1:].strip())
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = convert(f.read())
    with open(sys.argv[2], "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
PY
chmod +x /app/ini2json.py

# step: convert legacy.conf into config.json
python3 /app/ini2json.py /app/legacy.conf /app/config.json
cat /app/config.json
