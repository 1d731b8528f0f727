import hashlib, os, sqlite3, sys
fails = []
OLD, NEW = "Tr0ub4dor&3", "N3w/Pa$$-w0rd\\9&x"
O = "/tests/orig"
for root, dirs, files in os.walk(O):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), O)
        orig = open(os.path.join(root, f)).read()
        p = os.path.join("/app", rel)
        try:
            got = open(p).read()
        except FileNotFoundError:
            fails.append(f"{p} missing"); continue
        if got != orig.replace(OLD, NEW): fails.append(f"{p} not correctly updated")
        if OLD in got.replace(NEW, ""): fails.append(f"{p} still contains the old password")
try:
    db = sqlite3.connect("file:/app/db/auth.db?mode=ro", uri=True)
    rows = {r[0]: r[1:] for r in db.execute("SELECT username, salt, pw_hash, rotated_at FROM credentials")}
    a = rows.get("appuser")
    if not a or a[0] != "s4lt-a1" or a[1] != hashlib.sha256(("s4lt-a1" + NEW).encode()).hexdigest() or a[2] != "2024-07-01":
        fails.append(f"appuser row wrong: {a}")
    if rows.get("reporting") != ("s4lt-b2", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "2023-03-02"):
        fails.append("reporting row changed")
    if len(rows) != 2: fails.append("rows added/removed")
except Exception as e:
    fails.append(f"db: {e}")
if os.path.exists("/app/new_password.txt"): fails.append("new_password.txt not deleted")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
