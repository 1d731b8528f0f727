#!/bin/bash
# Verifier for git-purge-secret
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app/service 2>/dev/null || { echo "FAIL: no repo"; exit 0; }
fail() { echo "FAIL: $*"; exit 0; }
TOKEN=sk_live_51HxQ9kTz8pLmN3vRb7Wc2Yd
git rev-parse -q --verify refs/heads/main >/dev/null || fail "main missing"
git rev-parse -q --verify refs/heads/release >/dev/null || fail "release missing"
# 1. no commit reachable from any ref has the file
for c in $(git rev-list --all); do
  git cat-file -e "$c:config/secrets.env" 2>/dev/null && fail "commit $c still has config/secrets.env"
done
# commit messages preserved in order
[ "$(git log --reverse --format=%s release | paste -sd'|')" = "Initial service|Read port from env|Add README and redis config|Release 1.0" ] || fail "release history wrong: $(git log --reverse --format=%s release | paste -sd'|')"
[ "$(git log --reverse --format=%s main | paste -sd'|')" = "Initial service|Read port from env|Add README and redis config|Add health check|Ignore secrets.env" ] \
 && [ "$(git log --reverse --format=%s main~1 | paste -sd'|')" = "Initial service|Read port from env|Add README and redis config|Add health check" ] \
 || fail "main history wrong: $(git log --reverse --format=%s main | paste -sd'|')"
# other content intact
[ "$(git show release:VERSION)" = "VERSION=1.0" ] || fail "release VERSION wrong"
[ "$(git show main:config/app.env)" = "$(printf 'PORT=8080\nLOG_LEVEL=info')" ] || fail "config/app.env wrong"
git show main:src/health.py | grep -q 'return "ok"' || fail "health.py missing"
git show main:README.md | grep -q 'Config lives' || fail "README missing"
[ "$(git show main~4:src/app.py 2>/dev/null)" = 'print("service v1")' ] || fail "initial app.py wrong"
# .gitignore
[ "$(git show main:.gitignore)" = "$(printf '__pycache__/\n*.pyc\nconfig/secrets.env')" ] || fail ".gitignore wrong: $(git show main:.gitignore | paste -sd'|')"
[ "$(git log -1 --format=%s main)" = "Ignore secrets.env" ] || fail "last commit wrong"
[ "$(git diff --name-only main~1 main)" = ".gitignore" ] || fail "Ignore commit touches other files"
# 2. the token is gone from every object and from refs/original
[ -z "$(git for-each-ref refs/original)" ] || fail "refs/original still present"
if git cat-file --batch-all-objects --batch 2>/dev/null | grep -aq "$TOKEN"; then fail "token still in object database"; fi
grep -rqa "$TOKEN" .git 2>/dev/null && fail "token string found under .git"
[ "$(git symbolic-ref -q --short HEAD)" = "main" ] || fail "main not checked out"
[ -z "$(git status --porcelain)" ] || fail "working tree not clean"
echo PASS
echo 1 > /logs/verifier/reward.txt
