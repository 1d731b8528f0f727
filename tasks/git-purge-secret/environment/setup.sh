#!/bin/bash
set -e
git config --global user.email "ops@example.com"
git config --global user.name "Ops Team"
git config --global init.defaultBranch main
mkdir -p /app/service && cd /app/service && git init -q
mkdir -p config src
printf '__pycache__/\n*.pyc\n' > .gitignore
printf 'PORT=8080\n' > config/app.env
printf 'print("service v1")\n' > src/app.py
git add . && git commit -qm "Initial service"
printf 'STRIPE_TOKEN=sk_live_51HxQ9kTz8pLmN3vRb7Wc2Yd\nDB_PASS=hunter2-prod\n' > config/secrets.env
git add config/secrets.env && git commit -qm "Add production secrets"
printf 'import os\nprint("service v2", os.environ.get("PORT"))\n' > src/app.py
printf 'PORT=8080\nLOG_LEVEL=info\n' > config/app.env
git commit -qam "Read port from env"
printf 'STRIPE_TOKEN=sk_live_51HxQ9kTz8pLmN3vRb7Wc2Yd\nDB_PASS=hunter2-prod\nREDIS_URL=redis://cache:6379\n' > config/secrets.env
printf '# Service\nConfig lives in config/.\n' > README.md
git add . && git commit -qm "Add README and redis config"
git checkout -qb release
printf 'VERSION=1.0\n' > VERSION
git add VERSION && git commit -qm "Release 1.0"
git checkout -q main
git rm -q config/secrets.env && git commit -qm "Remove secrets file"
printf 'def health():\n    return "ok"\n' > src/health.py
git add src/health.py && git commit -qm "Add health check"
git gc -q
