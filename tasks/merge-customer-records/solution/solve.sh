#!/bin/bash
set -euo pipefail

# step: create the database schema
rm -f /app/customers.db
sqlite3 /app/customers.db "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, plan TEXT NOT NULL, mrr REAL NOT NULL);"

# step: load CRM rows, deduplicated by normalized email keeping the lowest id
python3 - <<'PY'
import csv, sqlite3
rows = sorted(csv.DictReader(open("/app/data/crm.csv")), key=lambda r: int(r["id"]))
seen = {}
for r in rows:
    e = r["email"].strip().lower()
    seen.setdefault(e, (int(r["id"]), r["name"].strip(), e))
db = sqlite3.connect("/app/customers.db")
db.executemany("INSERT INTO customers (id, name, email, plan, mrr) VALUES (?, ?, ?, 'free', 0)", seen.values())
db.commit()
print(len(seen), "customers")
PY

# step: attach billing plans by normalized email
python3 - <<'PY'
import json, sqlite3
db = sqlite3.connect("/app/customers.db")
for b in json.load(open("/app/data/billing.json")):
    db.execute("UPDATE customers SET plan = ?, mrr = ? WHERE email = ?", (b["plan"], float(b["mrr"]), b["email"].strip().lower()))
db.commit()
PY
sqlite3 -header /app/customers.db "SELECT * FROM customers ORDER BY id"

# step: list billing emails with no CRM customer
python3 - <<'PY'
import json, sqlite3
db = sqlite3.connect("/app/customers.db")
have = {r[0] for r in db.execute("SELECT email FROM customers")}
miss = sorted({b["email"].strip().lower() for b in json.load(open("/app/data/billing.json"))} - have)
open("/app/unmatched_billing.txt", "w").write("".join(e + "\n" for e in miss))
PY
cat /app/unmatched_billing.txt
