#!/bin/bash
set -euo pipefail

# step: start the merge (it stops with a conflict in settings.py)
cd /app/webapp && git checkout -q main && { git merge --no-ff feature/retries || true; }
git -C /app/webapp status --short

# step: write the resolved settings.py and conclude the merge commit
cat > /app/webapp/settings.py <<'PY'
DEBUG = False
TIMEOUT = 45
RETRIES = 5
BACKOFF = 1.5
ALLOWED_HOSTS = ["example.com", "www.example.com", "api.example.com", "cdn.example.com"]
PY
python3 -B -c 'import ast; ast.parse(open("/app/webapp/settings.py").read())'
cd /app/webapp && git add settings.py && git commit -q --no-edit
git -C /app/webapp log --oneline --graph -5

# step: delete the merged feature branch
git -C /app/webapp branch -d feature/retries
