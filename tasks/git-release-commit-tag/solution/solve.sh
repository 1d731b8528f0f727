#!/bin/bash
set -euo pipefail

# step: ignore the build directory
echo 'build/' >> /app/mathlib/.gitignore
cat /app/mathlib/.gitignore

# step: commit all pending changes as the release
cd /app/mathlib && git add -A && git commit -qm "Release 2.0.0"
git -C /app/mathlib show --stat HEAD

# step: create the annotated release tag
git -C /app/mathlib tag -a v2.0.0 -m "Version 2.0.0"
