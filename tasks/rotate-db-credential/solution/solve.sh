#!/bin/bash
set -euo pipefail

# step: replace the old password in every config file that contains it
python3 - <<'PY'
import os
old = "Tr0ub4dor&3"
new = open("/app/new_password.txt").read().rstrip("\n")
for top in ("/app/config", "/app/deploy"):
    for root, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            s = open(p, encoding="utf-8").read()
            if old in s:
                open(p, "w", encoding="utf-8").write(s.replace(old, new))
                print("updated", p, s.count(old))
PY

# step: store the new salted hash for appuser
python3 - <<'PY'
import hashlib, sqlite3
new = open("/app/new_password.txt").read().rstrip("\n")
db = sqlite3.connect("/app/db/auth.db")
(salt,) = db.execute("SELECT salt FROM credentials WHERE username = 'appuser'").fetchone()
db.execute("UPDATE credentials SET pw_hash = ?, rotated_at = '2024-07-01' WHERE username = 'appuser'",
           (hashlib.sha256((salt + new).encode()).hexdigest(),))
db.commit()
PY
sqlite3 /app/db/auth.db "SELECT * FROM credentials"

# step: delete the plaintext password file
rm -f /app/new_password.txt
