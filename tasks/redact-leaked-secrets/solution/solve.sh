#!/bin/bash
set -euo pipefail

# step: locate leaked secrets and write /app/leaks.txt
python3 - <<'PY'
import os, re
pats = [r"AKIA[A-Z0-9]{16}", r"aws_secret_access_key\s*[=:]\s*(?!REDACTED\b)\S+", r"^[A-Z_]*PASSWORD[A-Z_]*=(?!REDACTED$).+", r"Authorization: Bearer [^\s}]+"]
hits = []
for root, dirs, files in os.walk("/app/bundle"):
    for f in files:
        p = os.path.join(root, f); rel = os.path.relpath(p, "/app/bundle")
        for n, line in enumerate(open(p, encoding="utf-8").read().splitlines(), 1):
            if any(re.search(x, line) for x in pats):
                hits.append((rel.encode(), n, rel))
open("/app/leaks.txt", "w").write("".join(f"{r}:{n}\n" for _, n, r in sorted(hits)))
PY
cat /app/leaks.txt

# step: replace each secret value with REDACTED
python3 - <<'PY'
import os, re
subs = [(r"AKIA[A-Z0-9]{16}", "REDACTED"),
        (r"(aws_secret_access_key\s*[=:]\s*)(?!REDACTED\b)\S+", r"\1REDACTED"),
        (r"(?m)^([A-Z_]*PASSWORD[A-Z_]*=)(?!REDACTED$).+$", r"\1REDACTED"),
        (r"(Authorization: Bearer )[^\s}]+", r"\1REDACTED")]
for root, dirs, files in os.walk("/app/bundle"):
    for f in files:
        p = os.path.join(root, f)
        s = open(p, encoding="utf-8").read(); t = s
        for a, b in subs:
            t = re.sub(a, b, t)
        if t != s:
            open(p, "w", encoding="utf-8").write(t); print("redacted", p)
PY

# step: restrict .env files to their owner
find /app/bundle -type f -name .env -exec chmod 0600 {} + -exec stat -c '%a %n' {} +
