#!/bin/bash
set -euo pipefail

# step: skip the CSV header row in load_csv
python3 - <<'PY'
p = "/app/inventory/inventory.py"; s = open(p).read()
s = s.replace("            for row in csv.reader(f):\n                sku, name, qty, price = row\n",
              "            for row in csv.DictReader(f):\n                sku, name, qty, price = row[\"sku\"], row[\"name\"], row[\"qty\"], row[\"unit_price\"]\n")
open(p, "w").write(s)
PY

# step: make remove() reject overdrawing stock
python3 - <<'PY'
p = "/app/inventory/inventory.py"; s = open(p).read()
s = s.replace('        if qty <= 0:\n            raise ValueError("qty must be positive")\n',
              '        if not isinstance(qty, int) or qty <= 0 or qty > item["qty"]:\n            raise ValueError("qty must be positive and not exceed stock")\n')
open(p, "w").write(s)
PY

# step: keep prices as floats in total_value and use a strict threshold in low_stock
sed -i 's/item\["qty"\] \* int(item\["unit_price"\])/item["qty"] * item["unit_price"]/; s/if item\["qty"\] <= threshold/if item["qty"] < threshold/' /app/inventory/inventory.py
cat /app/inventory/inventory.py

# step: regenerate the report
cd /app && python3 /app/run_report.py
