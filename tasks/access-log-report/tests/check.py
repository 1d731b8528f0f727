import json, re, sys
from collections import Counter
fails = []
ips, codes, err = Counter(), Counter(), Counter()
rx = re.compile(r'^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) ')
for line in open("/tests/access.log"):
    m = rx.match(line)
    ip, meth, path, code = m.groups()
    ips[ip] += 1; codes[code] += 1
    if code.startswith("5"): err[path] += 1
top = sorted(ips.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
try:
    if open("/app/report/top_ips.txt").read().strip().splitlines() != [f"{c} {ip}" for ip, c in top]:
        fails.append(f"top_ips.txt wrong; want {top}")
except FileNotFoundError:
    fails.append("top_ips.txt missing")
try:
    got = json.load(open("/app/report/status_codes.json"))
    if {str(k): v for k, v in got.items()} != dict(codes): fails.append(f"status_codes.json {got} != {dict(codes)}")
except Exception as e:
    fails.append(f"status_codes.json: {e}")
want = ["path,errors"] + [f"{p},{c}" for p, c in sorted(err.items(), key=lambda kv: (-kv[1], kv[0]))]
try:
    if open("/app/report/errors_by_path.csv").read().strip().splitlines() != want: fails.append(f"errors_by_path.csv wrong; want {want}")
except FileNotFoundError:
    fails.append("errors_by_path.csv missing")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
