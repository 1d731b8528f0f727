#!/bin/bash
set -euo pipefail

# step: parse dates as YYYY-MM-DD
sed -i 's/"%Y-%d-%m"/"%Y-%m-%d"/' /app/bizdays.py

# step: make the range inclusive and exclude Saturdays
sed -i 's/    while day < end:/    while day <= end:/; s/day.weekday() < 6 and/day.weekday() < 5 and/' /app/bizdays.py

# step: exit with status 2 when end is before start
python3 - <<'PY'
p = "/app/bizdays.py"; s = open(p).read()
s = s.replace('print("error: end before start", file=sys.stderr)\n        return 1', 'print("error: end before start", file=sys.stderr)\n        return 2')
open(p, "w").write(s)
PY
python3 /app/bizdays.py 2024-01-05 2024-01-01 || echo "exit $?"

# step: compute Q1 2024 business days into /app/q1_2024.txt
python3 /app/bizdays.py 2024-01-01 2024-03-31 --holidays /app/holidays.txt > /app/q1_2024.txt
cat /app/q1_2024.txt
