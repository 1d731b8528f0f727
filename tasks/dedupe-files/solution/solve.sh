#!/bin/bash
set -euo pipefail

# step: group files by sha256 and write /app/dupes.json
python3 - <<'PY'
import hashlib, json, os
groups = {}
for root, dirs, files in os.walk("/app/photos"):
    for f in files:
        p = os.path.join(root, f)
        if os.path.isfile(p) and not os.path.islink(p):
            groups.setdefault(hashlib.sha256(open(p, "rb").read()).hexdigest(), []).append(p)
out = []
for paths in groups.values():
    if len(paths) > 1:
        paths.sort(key=lambda s: s.encode())
        out.append({"kept": paths[0], "removed": paths[1:]})
out.sort(key=lambda g: g["kept"].encode())
json.dump(out, open("/app/dupes.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY

# step: record the bytes that deduplication frees
python3 -c 'import json,os; print(sum(os.path.getsize(p) for g in json.load(open("/app/dupes.json")) for p in g["removed"]))' > /app/bytes_saved.txt
cat /app/bytes_saved.txt

# step: replace every removed copy with an absolute symlink to the kept file
jq -r '.[] | .kept as $k | .removed[] | [$k, .] | @tsv' /app/dupes.json | while IFS=$'\t' read -r kept dup; do ln -sfn "$kept" "$dup"; done
find /app/photos -type l -printf '%p -> %l\n'
