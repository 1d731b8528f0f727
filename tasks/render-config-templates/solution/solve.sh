#!/bin/bash
set -euo pipefail

# step: write the renderer /app/render.sh
cat > /app/render.sh <<'SH'
#!/bin/bash
# usage: render.sh ENV_FILE TEMPLATE
set -euo pipefail
exec python3 - "$1" "$2" <<'PY'
import re, sys
env = {}
with open(sys.argv[1], newline="") as f:
    for line in f.read().split("\n"):
        line = line.rstrip("\r")
        if not line.strip() or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        env[k.strip()] = v
tpl = open(sys.argv[2], newline="").read()
rx = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)(?:\|(.*?))?\}\}")
for m in rx.finditer(tpl):
    if m.group(1) not in env and m.group(2) is None:
        sys.stderr.write(f"error: undefined variable {m.group(1)}\n")
        sys.exit(3)
out = rx.sub(lambda m: env[m.group(1)] if m.group(1) in env else m.group(2), tpl)
sys.stdout.write(out)
PY
SH
chmod 0755 /app/render.sh

# step: render the templates for production
mkdir -p /app/out/prod
for t in /app/templates/*.tmpl; do n=$(basename "$t" .tmpl); /app/render.sh /app/env/prod.env "$t" > "/app/out/prod/$n"; done
head -50 /app/out/prod/*

# step: render the templates for staging
mkdir -p /app/out/staging
for t in /app/templates/*.tmpl; do n=$(basename "$t" .tmpl); /app/render.sh /app/env/staging.env "$t" > "/app/out/staging/$n"; done
head -50 /app/out/staging/*
