#!/bin/bash
set -euo pipefail

# step: filter the valid rows into /app/sales_clean.csv
python3 - <<'PY'
import re
lines = open("/app/sales.csv").read().splitlines()
out = [lines[0]]
for l in lines[1:]:
    f = l.split(",")
    if len(f) == 5 and re.fullmatch(r"[1-9][0-9]*", f[3]) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", f[4]):
        out.append(l)
open("/app/sales_clean.csv", "w").write("\n".join(out) + "\n")
print(len(out) - 1, "valid of", len(lines) - 1)
PY

# step: aggregate the clean rows into /app/summary.json
python3 - <<'PY'
import csv, json
total_lines = len(open("/app/sales.csv").read().splitlines()) - 1
rows = list(csv.DictReader(open("/app/sales_clean.csv")))
reg = {}
for r in rows:
    g = reg.setdefault(r["region"].strip(), {"units": 0, "revenue": 0.0})
    g["units"] += int(r["units"]); g["revenue"] += int(r["units"]) * float(r["unit_price"])
tot = sum(g["revenue"] for g in reg.values())
for g in reg.values():
    g["revenue"] = round(g["revenue"], 2)
json.dump({"regions": reg, "total_revenue": round(tot, 2), "valid_rows": len(rows),
           "skipped_rows": total_lines - len(rows)}, open("/app/summary.json", "w"), indent=2)
PY
cat /app/summary.json

# step: write the top-3 products by revenue
python3 - <<'PY'
import csv
rev = {}
for r in csv.DictReader(open("/app/sales_clean.csv")):
    rev[r["product"]] = rev.get(r["product"], 0) + int(r["units"]) * float(r["unit_price"])
top = sorted(rev.items(), key=lambda kv: -kv[1])[:3]
open("/app/top_products.csv", "w").write("product,revenue\n" + "".join(f"{p},{v:.2f}\n" for p, v in top))
PY
cat /app/top_products.csv
