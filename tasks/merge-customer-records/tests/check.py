import sqlite3, sys
fails = []
want = {
    3: ("Ada Lovelace", "ada@example.com", "pro", 49.0),
    4: ("Ken Thompson", "ken@bell-labs.com", "team", 99.0),
    7: ("Grace Hopper", "grace@navy.mil", "enterprise", 499.5),
    9: ("Linus T", "linus@kernel.org", "free", 0.0),
    12: ("Alan Turing", "alan@bletchley.uk", "free", 0.0),
    21: ("Margaret Hamilton", "margaret@nasa.gov", "pro", 59.0),
}
try:
    db = sqlite3.connect("file:/app/customers.db?mode=ro", uri=True)
    cols = [(r[1], r[2].upper(), r[5]) for r in db.execute("PRAGMA table_info(customers)")]
    if [c[0] for c in cols] != ["id", "name", "email", "plan", "mrr"]:
        fails.append(f"columns {cols}")
    idx = [r for r in db.execute("PRAGMA index_list(customers)") if r[2]]
    if not idx:
        fails.append("email has no UNIQUE constraint")
    got = {r[0]: (r[1], r[2], r[3], float(r[4])) for r in db.execute("SELECT id, name, email, plan, mrr FROM customers")}
    if got != want:
        fails.append(f"rows {got}")
except Exception as e:
    fails.append(f"db: {e}")
try:
    if open("/app/unmatched_billing.txt").read().split() != ["bjarne@example.com", "dennis@bell-labs.com"]:
        fails.append("unmatched_billing.txt wrong")
except Exception as e:
    fails.append(f"unmatched: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
