#!/bin/bash
set -euo pipefail

# step: delete the zero-byte files at the top level of /app/downloads
find /app/downloads -maxdepth 1 -type f -empty -print -delete

# step: move each top-level regular file into a folder named after its lower-cased extension
python3 - <<'PY'
import os
base = "/app/downloads"
for name in sorted(os.listdir(base)):
    p = os.path.join(base, name)
    if not os.path.isfile(p) or os.path.islink(p) or name == "manifest.txt":
        continue
    stem = name[1:] if name.startswith(".") else name
    ext = stem.rsplit(".", 1)[1].lower() if "." in stem else "other"
    os.makedirs(os.path.join(base, ext), exist_ok=True)
    os.rename(p, os.path.join(base, ext, name))
    print(f"{name} -> {ext}/")
PY

# step: write the sorted manifest of moved files
cd /app/downloads && find . -mindepth 2 -type f ! -path './old/*' -printf '%P\n' | LC_ALL=C sort > /app/downloads/manifest.txt
cat /app/downloads/manifest.txt
