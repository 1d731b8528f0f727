#!/bin/bash
set -euo pipefail

# step: find the lost tip in the reflog and recreate feature/payments there
sha=$(git -C /app/shop log -g --format='%H %s' HEAD | awk '$0 ~ / Add refund support$/ {print $1; exit}')
echo "tip: $sha"
git -C /app/shop branch feature/payments "$sha"

# step: merge the branch into main with a merge commit
git -C /app/shop checkout -q main
git -C /app/shop merge --no-ff -m "Merge feature/payments" feature/payments
git -C /app/shop log --oneline --graph -8

# step: tag the merge as v1.1.0 (annotated)
git -C /app/shop tag -a v1.1.0 -m "Release 1.1.0" main
git -C /app/shop show --stat v1.1.0 | head -20
