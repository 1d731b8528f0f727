#!/bin/bash
set -euo pipefail

# step: scan the tree and write /app/todo_report.csv
python3 - <<'PY'
import csv, os, re
rows = []
for root, dirs, files in os.walk("/app/src"):
    for f in files:
        ext = os.path.splitext(f)[1]
        if ext not in (".py", ".sh", ".js"):
            continue
        mark = "//" if ext == ".js" else "#"
        rx = re.compile(re.escape(mark) + r"\s*(TODO|FIXME)(?:\(([^)]*)\))?:?(.*)$")
        p = os.path.join(root, f)
        for n, line in enumerate(open(p).read().splitlines(), 1):
            m = rx.search(line)
            if m:
                rows.append([os.path.relpath(p, "/app/src"), n, m.group(1), m.group(2) or "", m.group(3).strip()])
rows.sort(key=lambda r: (r[0], r[1]))
with open("/app/todo_report.csv", "w", newline="") as fh:
    w = csv.writer(fh); w.writerow(["file", "line", "kind", "owner", "text"]); w.writerows(rows)
PY
cat /app/todo_report.csv

# step: count matches per owner
python3 -c '
import csv, collections
c = collections.Counter((r["owner"] or "unassigned") for r in csv.DictReader(open("/app/todo_report.csv")))
open("/app/todo_by_owner.txt", "w").write("".join(f"{o} {n}\n" for o, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))))
'
cat /app/todo_by_owner.txt

# step: write the summary JSON
python3 -c '
import csv, json
rows = list(csv.DictReader(open("/app/todo_report.csv")))
json.dump({"TODO": sum(r["kind"] == "TODO" for r in rows), "FIXME": sum(r["kind"] == "FIXME" for r in rows), "files": len({r["file"] for r in rows})}, open("/app/todo_summary.json", "w"))
'
cat /app/todo_summary.json
