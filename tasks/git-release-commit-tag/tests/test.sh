#!/bin/bash
# Verifier for git-release-commit-tag
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app/mathlib 2>/dev/null || { echo "FAIL: no repo"; exit 0; }
fail() { echo "FAIL: $*"; exit 0; }
[ "$(git log -1 --format=%s main)" = "Release 2.0.0" ] || fail "HEAD message wrong"
[ "$(git log -1 --format=%s main~1)" = "Release 1.4.2" ] || fail "expected exactly one new commit"
[ "$(git show main:version.py)" = '__version__ = "2.0.0"' ] || fail "version.py not committed"
git show main:mathlib.py | grep -q 'def mul' || fail "mathlib.py not committed"
git show main:CHANGELOG.md | grep -q '## 2.0.0' || fail "CHANGELOG not committed"
git cat-file -e main:docs/mul.md 2>/dev/null || fail "docs/mul.md not committed"
[ -z "$(git ls-tree -r --name-only main | grep '^build/')" ] || fail "build/ committed"
for c in $(git rev-list --all); do [ -n "$(git ls-tree -r --name-only $c | grep '^build/')" ] && fail "build/ in some commit"; done
[ "$(git show main:.gitignore)" = "$(printf '*.pyc\nbuild/')" ] || fail ".gitignore wrong: $(git show main:.gitignore | paste -sd'|')"
[ -f build/lib/mathlib.so ] && [ -f build/build.log ] || fail "build artifacts deleted from disk"
[ "$(git cat-file -t v2.0.0 2>/dev/null)" = "tag" ] || fail "v2.0.0 missing or not annotated"
[ "$(git rev-parse 'v2.0.0^{commit}')" = "$(git rev-parse main)" ] || fail "v2.0.0 not on release commit"
[ "$(git cat-file tag v2.0.0 | sed -n '/^$/,$p' | sed 1d)" = "Version 2.0.0" ] || fail "tag message wrong"
[ "$(git cat-file -t v1.4.2)" = "tag" ] || fail "old tag damaged"
[ -z "$(git status --porcelain)" ] || fail "git status not clean"
echo PASS
echo 1 > /logs/verifier/reward.txt
