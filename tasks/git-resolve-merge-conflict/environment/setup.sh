#!/bin/bash
set -e
git config --global user.email "web@example.com"
git config --global user.name "Web Dev"
git config --global init.defaultBranch main
mkdir -p /app/webapp && cd /app/webapp && git init -q
cat > settings.py <<'PY'
DEBUG = False
TIMEOUT = 30
RETRIES = 1
ALLOWED_HOSTS = ["example.com"]
PY
printf 'from settings import *\n' > app.py
git add . && git commit -qm "Initial settings"
git checkout -qb feature/retries
cat > settings.py <<'PY'
DEBUG = False
TIMEOUT = 30
RETRIES = 5
BACKOFF = 1.5
ALLOWED_HOSTS = ["example.com", "api.example.com", "cdn.example.com"]
PY
printf 'def with_retries(fn, n):\n    for _ in range(n):\n        try:\n            return fn()\n        except Exception:\n            pass\n' > retry.py
git add . && git commit -qm "Add retry with backoff"
git checkout -q main
cat > settings.py <<'PY'
DEBUG = False
TIMEOUT = 45
RETRIES = 1
ALLOWED_HOSTS = ["example.com", "www.example.com", "api.example.com"]
PY
printf 'web: python app.py\n' > Procfile
git add . && git commit -qm "Raise timeout, add www host"
