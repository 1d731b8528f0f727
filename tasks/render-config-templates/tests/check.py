import os, re, subprocess, sys, tempfile
fails = []
def ref(envtext, tpl):
    env = {}
    for line in envtext.split("\n"):
        if not line.strip() or line.startswith("#") or "=" not in line: continue
        k, v = line.split("=", 1); env[k.strip()] = v
    rx = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)(?:\|(.*?))?\}\}")
    for m in rx.finditer(tpl):
        if m.group(1) not in env and m.group(2) is None: return None, m.group(1)
    return rx.sub(lambda m: env[m.group(1)] if m.group(1) in env else m.group(2), tpl), None
for envname in ("prod", "staging"):
    envtext = open(f"/tests/env/{envname}.env").read()
    for t in sorted(os.listdir("/tests/templates")):
        want, _ = ref(envtext, open(f"/tests/templates/{t}").read())
        p = f"/app/out/{envname}/{t[:-5]}"
        try:
            if open(p, newline="").read() != want: fails.append(f"{p} wrong")
        except FileNotFoundError:
            fails.append(f"{p} missing")
# behaviour on hidden cases
d = tempfile.mkdtemp()
cases = [
    ("A=1\nB=x=y&z\\1|/\nEMPTY=\n# C=no\n", "a={{A}} b={{B}} e=[{{EMPTY|dflt}}] c={{C|fallback|pipe}} {{ A }} {A} {{A}}{{A}}\n"),
    ("X=$HOME `id` {{Y}}\nY=boom\n", "{{X}}|{{Y}}|{{Z|}}\nno newline at end"),
    ("A=1\n", "ok {{A}} then {{MISSING}} and {{ALSO_MISSING}}\n"),
]
for i, (envtext, tpl) in enumerate(cases):
    open(f"{d}/e{i}", "w").write(envtext); open(f"{d}/t{i}", "w").write(tpl)
    try:
        r = subprocess.run(["/app/render.sh", f"{d}/e{i}", f"{d}/t{i}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        fails.append(f"case {i}: cannot run /app/render.sh: {e}"); continue
    want, missing = ref(envtext, tpl)
    if missing:
        if r.returncode != 3 or r.stdout or f"error: undefined variable {missing}" not in r.stderr:
            fails.append(f"case {i}: want exit 3 / error for {missing}; got rc={r.returncode} out={r.stdout!r} err={r.stderr!r}")
    elif r.returncode != 0 or r.stdout != want:
        fails.append(f"case {i}: got rc={r.returncode} {r.stdout!r} want {want!r} err={r.stderr[-200:]!r}")
if not os.access("/app/render.sh", os.X_OK): fails.append("render.sh not executable")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
