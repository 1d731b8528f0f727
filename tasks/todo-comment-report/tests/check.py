import csv, io, json, sys
fails = []
want = [
    ["lib/core.py", "3", "TODO", "alice", "cache this lookup"],
    ["lib/core.py", "5", "FIXME", "", "handle missing keys"],
    ["lib/core.py", "11", "TODO", "", "add tests"],
    ["lib/util.py", "2", "FIXME", "bob", "lo > hi is not checked"],
    ["scripts/deploy.sh", "2", "TODO", "bob", "parametrize the host"],
    ["scripts/deploy.sh", "4", "FIXME", "", "no rollback"],
    ["web/app.js", "1", "TODO", "carol", "switch to fetch API"],
    ["web/app.js", "3", "FIXME", "alice", "no error handling"],
    ["web/app.js", "6", "TODO", "", 'inside a string is still reported (simple scanner)";'],
]
try:
    got = list(csv.reader(io.StringIO(open("/app/todo_report.csv", newline="").read())))
    if got != [["file", "line", "kind", "owner", "text"]] + want: fails.append(f"todo_report.csv wrong: {got}")
except FileNotFoundError:
    fails.append("todo_report.csv missing")
try:
    if open("/app/todo_by_owner.txt").read().splitlines() != ["unassigned 4", "alice 2", "bob 2", "carol 1"]:
        fails.append("todo_by_owner.txt wrong: " + open("/app/todo_by_owner.txt").read())
except FileNotFoundError:
    fails.append("todo_by_owner.txt missing")
try:
    if json.load(open("/app/todo_summary.json")) != {"TODO": 5, "FIXME": 4, "files": 4}: fails.append("todo_summary.json wrong")
except Exception as e:
    fails.append(f"todo_summary.json: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
