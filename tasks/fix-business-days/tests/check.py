import datetime as dt, subprocess, sys, tempfile
fails = []
def ref(a, b, hol):
    s, e = dt.date.fromisoformat(a), dt.date.fromisoformat(b)
    n = 0
    while s <= e:
        if s.weekday() < 5 and s not in hol: n += 1
        s += dt.timedelta(days=1)
    return n
def run(*args):
    return subprocess.run([sys.executable, "/app/bizdays.py", *args], capture_output=True, text=True, timeout=20)
hf = tempfile.NamedTemporaryFile("w", delete=False, suffix=".txt")
hf.write("# test\n2023-12-25\n\n2023-12-26\n2024-01-01\n"); hf.close()
hol = {dt.date(2023, 12, 25), dt.date(2023, 12, 26), dt.date(2024, 1, 1)}
for a, b, h in [("2024-01-01", "2024-01-31", None), ("2024-02-03", "2024-02-04", None),
                ("2024-02-02", "2024-02-02", None), ("2024-02-03", "2024-02-03", None),
                ("2023-12-20", "2024-01-10", hf.name), ("2024-02-26", "2024-03-04", None),
                ("2023-01-13", "2023-11-30", None)]:
    r = run(a, b, *(["--holidays", h] if h else []))
    want = ref(a, b, hol if h else set())
    if r.returncode != 0 or r.stdout != f"{want}\n":
        fails.append(f"{a}..{b} holidays={bool(h)}: rc={r.returncode} out={r.stdout!r} err={r.stderr.strip()[-200:]!r} want {want}")
r = run("2024-03-10", "2024-03-01")
if r.returncode != 2 or "error: end before start" not in r.stderr or r.stdout:
    fails.append(f"reversed range: rc={r.returncode} err={r.stderr!r}")
q1hol = {dt.date(2024, 1, 1), dt.date(2024, 1, 15), dt.date(2024, 2, 19), dt.date(2024, 3, 29), dt.date(2024, 3, 30)}
try:
    if open("/app/q1_2024.txt").read().strip() != str(ref("2024-01-01", "2024-03-31", q1hol)):
        fails.append("q1_2024.txt wrong")
except Exception as e:
    fails.append(f"q1_2024.txt: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
