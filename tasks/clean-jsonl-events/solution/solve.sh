#!/bin/bash
set -euo pipefail

# step: list the line numbers of malformed records in /app/rejected.txt
python3 - <<'PY'
import json
bad = []
for n, line in enumerate(open("/app/events.jsonl").read().splitlines(), 1):
    try:
        o = json.loads(line)
        ok = isinstance(o, dict) and all(k in o for k in ("event_id", "user", "type", "ts"))
    except Exception:
        ok = False
    if not ok:
        bad.append(n)
open("/app/rejected.txt", "w").write("".join(f"{n}\n" for n in bad))
print(bad)
PY

# step: dedupe, normalize timestamps and sort into /app/events_clean.jsonl
python3 - <<'PY'
import json, datetime
bad = {int(x) for x in open("/app/rejected.txt").read().split()}
seen, out = set(), []
for n, line in enumerate(open("/app/events.jsonl").read().splitlines(), 1):
    if n in bad:
        continue
    o = json.loads(line)
    if o["event_id"] in seen:
        continue
    seen.add(o["event_id"])
    ts = o["ts"]
    if isinstance(ts, (int, float)):
        d = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    else:
        d = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone(datetime.timezone.utc)
    out.append({"event_id": o["event_id"], "user": o["user"], "type": o["type"], "ts": d.strftime("%Y-%m-%dT%H:%M:%SZ")})
out.sort(key=lambda o: (o["ts"], o["event_id"]))
open("/app/events_clean.jsonl", "w").write("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in out))
PY
cat /app/events_clean.jsonl

# step: count events per UTC date
{ echo "date,count"; jq -r '.ts[0:10]' /app/events_clean.jsonl | sort | uniq -c | awk '{print $2","$1}'; } > /app/daily_counts.csv
cat /app/daily_counts.csv
