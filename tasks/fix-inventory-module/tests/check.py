import os, subprocess, sys, tempfile
sys.path.insert(0, "/app")
fails = []
def expect_raises(exc, fn, label):
    try:
        fn()
    except exc:
        return
    except Exception as e:
        fails.append(f"{label}: raised {type(e).__name__}, want {exc.__name__}"); return
    fails.append(f"{label}: no {exc.__name__} raised")
try:
    from inventory.inventory import Inventory
    inv = Inventory()
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("sku,name,qty,unit_price\nX1,a,10,1.25\nX2,b,3,0.99\nX1,a,5,1.25\nX3,c,7,2.50\n")
    inv.load_csv(f.name)
    if {k: v["qty"] for k, v in inv.items.items()} != {"X1": 15, "X2": 3, "X3": 7}:
        fails.append(f"load_csv quantities wrong: {inv.items}")
    if inv.total_value() != round(15 * 1.25 + 3 * 0.99 + 7 * 2.5, 2):
        fails.append(f"total_value {inv.total_value()}")
    if inv.low_stock(7) != ["X2"]:
        fails.append(f"low_stock(7) = {inv.low_stock(7)}")
    expect_raises(ValueError, lambda: inv.remove("X2", 4), "remove more than stock")
    if inv.items.get("X2", {}).get("qty") != 3:
        fails.append("failed remove changed stock")
    expect_raises(KeyError, lambda: inv.remove("NOPE", 1), "remove unknown sku")
    expect_raises(ValueError, lambda: inv.remove("X1", 0), "remove zero")
    expect_raises(ValueError, lambda: inv.add("X9", "z", -1, 1.0), "add negative")
    inv.remove("X2", 3)
    if "X2" in inv.items:
        fails.append("sku with qty 0 not deleted")
    inv.remove("X1", 5)
    if inv.items["X1"]["qty"] != 10:
        fails.append("remove partial wrong")
except Exception as e:
    fails.append(f"module error: {type(e).__name__}: {e}")
items = {"A-100": (150, 0.35), "B-200": (5, 0.10), "C-300": (5, 0.05), "D-400": (2, 4.99), "E-500": (4, 2.75)}
tv = round(sum(q * p for q, p in items.values()), 2)
low = ",".join(sorted(k for k, (q, p) in items.items() if q < 5))
want = f"items: {len(items)}\ntotal_value: {tv:.2f}\nlow_stock: {low}\n"
try:
    if open("/app/report.txt").read() != want:
        fails.append(f"report.txt = {open('/app/report.txt').read()!r}, want {want!r}")
except Exception as e:
    fails.append(f"report.txt: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
