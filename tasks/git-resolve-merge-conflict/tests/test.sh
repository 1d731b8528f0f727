#!/bin/bash
# Verifier for git-resolve-merge-conflict
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app/webapp 2>/dev/null || { echo "FAIL: no repo"; exit 0; }
fail() { echo "FAIL: $*"; exit 0; }
[ "$(git symbolic-ref -q --short HEAD)" = "main" ] || fail "main not checked out"
[ -z "$(git status --porcelain)" ] || fail "working tree not clean / merge unfinished"
[ -e .git/MERGE_HEAD ] && fail "merge still in progress"
[ "$(git rev-list --parents -n1 main | wc -w)" = 3 ] || fail "main tip is not a merge commit"
[ "$(git log -1 --format=%s main^1)" = "Raise timeout, add www host" ] || fail "first parent is not old main"
[ "$(git log -1 --format=%s main^2)" = "Add retry with backoff" ] || fail "second parent is not feature/retries"
git rev-parse -q --verify refs/heads/feature/retries >/dev/null && fail "feature/retries not deleted"
for f in retry.py Procfile app.py settings.py; do git cat-file -e main:$f 2>/dev/null || fail "$f missing in merge"; done
git show main:settings.py > /tmp/settings_check.py
grep -qE '^(<<<<<<<|=======|>>>>>>>)' /tmp/settings_check.py && fail "conflict markers left"
python3 -B - <<'PY' || fail "settings.py values wrong"
import runpy, sys
ns = runpy.run_path("/tmp/settings_check.py")
want = {"DEBUG": False, "TIMEOUT": 45, "RETRIES": 5, "BACKOFF": 1.5,
        "ALLOWED_HOSTS": ["example.com", "www.example.com", "api.example.com", "cdn.example.com"]}
got = {k: ns.get(k) for k in want}
print(got)
sys.exit(0 if got == want else 1)
PY
echo PASS
echo 1 > /logs/verifier/reward.txt
