#!/bin/bash
set -e
git config --global user.email "dev@example.com"
git config --global user.name "Shop Dev"
git config --global init.defaultBranch main
mkdir -p /app/shop && cd /app/shop && git init -q
printf 'def total(items):\n    return sum(items)\n' > cart.py
printf '# Shop\n' > README.md
git add . && git commit -qm "Initial shop"
git checkout -qb feature/payments
printf 'def charge(amount):\n    return {"status": "ok", "amount": amount}\n' > payments.py
git add payments.py && git commit -qm "Add payment charging"
printf 'def refund(amount):\n    return {"status": "refunded", "amount": amount}\n' > refunds.py
git add refunds.py && git commit -qm "Add refund support"
git checkout -q main
printf '# Shop\n\nA tiny shop.\n' > README.md
git commit -qam "Expand README"
printf 'def total(items):\n    return round(sum(items), 2)\n' > cart.py
git commit -qam "Round cart totals"
git branch -D feature/payments
git checkout -qb experiment && printf 'x\n' > exp.txt && git add exp.txt && git commit -qm "Experiment" && git checkout -q main && git branch -D experiment
