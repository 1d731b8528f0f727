import json, sys
from decimal import Decimal
fails = []
lines = open("/tests/sales.csv").read().splitlines()
valid = []
for l in lines[1:]:
    f = l.split(",")
    if len(f) != 5: continue
    if not f[3].isdigit() or int(f[3]) <= 0: continue
    try:
        p = Decimal(f[4])
    except Exception:
        continue
    if p < 0 or not f[4].replace(".", "", 1).isdigit(): continue
    valid.append(f)
try:
    got = open("/app/sales_clean.csv").read().splitlines()
    if got != [lines[0]] + [",".join(f) for f in valid]:
        fails.append(f"sales_clean.csv wrong: {got}")
except Exception as e:
    fails.append(f"sales_clean.csv: {e}")
reg, prod = {}, {}
for f in valid:
    r = f[1].strip(); rv = int(f[3]) * Decimal(f[4])
    g = reg.setdefault(r, [0, Decimal(0)]); g[0] += int(f[3]); g[1] += rv
    prod[f[2]] = prod.get(f[2], Decimal(0)) + rv
try:
    s = json.load(open("/app/summary.json"))
    if set(s.get("regions", {})) != set(reg):
        fails.append(f"regions {sorted(s.get('regions', {}))} != {sorted(reg)}")
    for r, (u, rv) in reg.items():
        g = s["regions"].get(r, {})
        if g.get("units") != u or abs(float(g.get("revenue", -1)) - float(rv)) > 0.005:
            fails.append(f"region {r}: {g} want units={u} revenue={rv}")
    tot = sum(v[1] for v in reg.values())
    if abs(float(s.get("total_revenue", -1)) - float(tot)) > 0.005:
        fails.append(f"total_revenue {s.get('total_revenue')} want {tot}")
    if s.get("valid_rows") != len(valid) or s.get("skipped_rows") != len(lines) - 1 - len(valid):
        fails.append("valid_rows/skipped_rows wrong")
except Exception as e:
    fails.append(f"summary.json: {e}")
top = sorted(prod.items(), key=lambda kv: -kv[1])[:3]
want = "product,revenue\n" + "".join(f"{p},{v:.2f}\n" for p, v in top)
try:
    if open("/app/top_products.csv").read().strip() != want.strip():
        fails.append(f"top_products.csv wrong, want:\n{want}")
except Exception as e:
    fails.append(f"top_products.csv: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
