import json, sys
fails = []
want = [
    ("e9", "hal", "click", "2024-04-30T00:00:00Z"),
    ("e1", "ann", "login", "2024-05-01T10:00:00Z"),
    ("e2", "bob", "login", "2024-05-01T10:00:00Z"),
    ("e3", "ann", "click", "2024-05-01T23:59:59Z"),
    ("e0", "gus", "login", "2024-05-02T00:00:00Z"),
    ("e5", "dan", "purchase", "2024-05-02T00:00:00Z"),
    ("e6", "ann", "logout", "2024-05-02T00:00:00Z"),
]
try:
    if open("/app/rejected.txt").read().split() != ["4", "6", "7", "10", "11"]:
        fails.append("rejected.txt wrong: " + open("/app/rejected.txt").read().replace("\n", " "))
except Exception as e:
    fails.append(f"rejected.txt: {e}")
try:
    lines = [l for l in open("/app/events_clean.jsonl").read().splitlines()]
    got = [json.loads(l) for l in lines]
    exp = [dict(zip(("event_id", "user", "type", "ts"), w)) for w in want]
    if got != exp:
        fails.append(f"events_clean wrong: {got}")
except Exception as e:
    fails.append(f"events_clean: {e}")
try:
    if open("/app/daily_counts.csv").read().split() != ["date,count", "2024-04-30,1", "2024-05-01,3", "2024-05-02,3"]:
        fails.append("daily_counts.csv wrong")
except Exception as e:
    fails.append(f"daily_counts: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
