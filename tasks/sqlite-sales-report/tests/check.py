import csv, io, json, sqlite3, sys
fails = []
ref = sqlite3.connect(":memory:")
ref.executescript(open("/tests/seed.sql").read())
good_items = sorted(ref.execute("SELECT * FROM order_items WHERE order_id IN (SELECT id FROM orders)").fetchall())
rev = {}
for sku, name, units, cents in ref.execute("""SELECT p.sku, p.name,
        COALESCE((SELECT SUM(oi.qty) FROM order_items oi JOIN orders o ON o.id=oi.order_id WHERE o.status='paid' AND oi.product_id=p.id),0),
        COALESCE((SELECT SUM(oi.qty*oi.unit_price_cents) FROM order_items oi JOIN orders o ON o.id=oi.order_id WHERE o.status='paid' AND oi.product_id=p.id),0)
        FROM products p"""):
    rev[sku] = (name, units, cents)
monthly = {}
for m, c in ref.execute("SELECT substr(o.created_at,1,7), SUM(oi.qty*oi.unit_price_cents) FROM orders o JOIN order_items oi ON oi.order_id=o.id WHERE o.status='paid' GROUP BY 1"):
    monthly[m] = round(c / 100.0, 2)
try:
    db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
    items = sorted(db.execute("SELECT * FROM order_items").fetchall())
    if items != good_items:
        fails.append(f"order_items: {len(items)} rows, expected the {len(good_items)} non-orphan rows unchanged")
    if sorted(db.execute("SELECT * FROM orders").fetchall()) != sorted(ref.execute("SELECT * FROM orders").fetchall()):
        fails.append("orders table changed")
    try:
        cur = db.execute("SELECT * FROM v_product_revenue")
        cols = [d[0] for d in cur.description]
        got = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
        if cols != ["sku", "name", "units", "revenue_cents"]:
            fails.append(f"view columns {cols}")
        if got != rev:
            fails.append(f"view rows differ: {got}")
        if db.execute("SELECT type FROM sqlite_master WHERE name='v_product_revenue'").fetchone() != ("view",):
            fails.append("v_product_revenue is not a view")
    except Exception as e:
        fails.append(f"view: {e}")
except Exception as e:
    fails.append(f"db: {e}")
top = sorted(rev.items(), key=lambda kv: (-kv[1][2], kv[0]))[:5]
want = [["sku", "name", "units", "revenue"]] + [[s, n, str(u), f"{c/100:.2f}"] for s, (n, u, c) in top]
try:
    got = list(csv.reader(io.StringIO(open("/app/report.csv").read())))
    if got != want:
        fails.append(f"report.csv {got} != {want}")
except Exception as e:
    fails.append(f"report.csv: {e}")
try:
    m = json.load(open("/app/monthly.json"))
    if set(m) != set(monthly) or any(abs(float(m[k]) - monthly[k]) > 0.001 for k in monthly):
        fails.append(f"monthly.json {m} != {monthly}")
except Exception as e:
    fails.append(f"monthly.json: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
