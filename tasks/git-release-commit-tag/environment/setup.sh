#!/bin/bash
set -e
git config --global user.email "lib@example.com"
git config --global user.name "Lib Maintainer"
git config --global init.defaultBranch main
mkdir -p /app/mathlib && cd /app/mathlib && git init -q
printf '*.pyc\n' > .gitignore
printf '__version__ = "1.4.2"\n' > version.py
printf 'def add(a, b):\n    return a + b\n' > mathlib.py
printf '# Changelog\n\n## 1.4.2\n- fixes\n' > CHANGELOG.md
git add . && git commit -qm "Release 1.4.2" && git tag -a v1.4.2 -m "Version 1.4.2"
printf '__version__ = "2.0.0"\n' > version.py
printf 'def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n' > mathlib.py
printf '# Changelog\n\n## 2.0.0\n- add mul()\n\n## 1.4.2\n- fixes\n' > CHANGELOG.md
mkdir -p docs && printf 'mul(a, b) multiplies.\n' > docs/mul.md
mkdir -p build/lib && printf 'compiled\n' > build/lib/mathlib.so && printf 'log\n' > build/build.log
