#!/bin/bash
# Verifier for git-recover-deleted-branch
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app/shop 2>/dev/null || { echo "FAIL: no repo"; exit 0; }
fail() { echo "FAIL: $*"; exit 0; }
tip=$(git rev-parse -q --verify refs/heads/feature/payments) || fail "branch feature/payments missing"
[ "$(git log -1 --format=%s "$tip")" = "Add refund support" ] || fail "branch tip is not 'Add refund support'"
[ "$(git log -1 --format=%s "$tip^")" = "Add payment charging" ] || fail "branch history wrong"
[ "$(git log -1 --format=%s "$tip~2")" = "Initial shop" ] || fail "branch not based on Initial shop"
[ "$(git symbolic-ref -q --short HEAD)" = "main" ] || fail "main not checked out"
[ -z "$(git status --porcelain)" ] || fail "working tree not clean"
m=$(git rev-parse main)
[ "$(git log -1 --format=%s main)" = "Merge feature/payments" ] || fail "main tip message wrong"
parents=$(git rev-list --parents -n1 main | wc -w)
[ "$parents" = 3 ] || fail "main tip is not a merge commit"
[ "$(git rev-parse main^2)" = "$tip" ] || fail "second parent is not the recovered tip"
[ "$(git log -1 --format=%s main^1)" = "Round cart totals" ] || fail "first parent is not old main"
for f in payments.py refunds.py cart.py README.md; do git cat-file -e main:$f 2>/dev/null || fail "$f missing on main"; done
git show main:cart.py | grep -q 'round(sum(items), 2)' || fail "main lost its own changes"
git cat-file -e main:exp.txt 2>/dev/null && fail "experiment commit merged"
[ "$(git cat-file -t v1.1.0 2>/dev/null)" = "tag" ] || fail "v1.1.0 is not an annotated tag"
[ "$(git rev-parse 'v1.1.0^{commit}')" = "$m" ] || fail "v1.1.0 does not point at the merge"
[ "$(git cat-file tag v1.1.0 | sed -n '/^$/,$p' | sed 1d)" = "Release 1.1.0" ] || fail "tag message wrong"
cd /tmp && python3 -B -c "import sys; sys.path.insert(0,'/app/shop'); import payments, refunds; assert refunds.refund(5)['status']=='refunded'" || fail "merged modules broken"
echo PASS
echo 1 > /logs/verifier/reward.txt
