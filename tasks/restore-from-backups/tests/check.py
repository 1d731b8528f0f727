import hashlib, os, subprocess, sys
want = {
    "README.md": "# Project\nversion 1\n",
    "src/main.py": "print('v2')\n",
    "src/util.py": "def helper():\n    return 1\n",
    "src/api.py": "API = 2\n",
    "config/app.yaml": "debug: false\nport: 8080\n",
    "docs/guide.md": "guide v1\n",
    "docs/changelog.md": "- day 2\n- day 3\n",
}
fails = []
R = "/app/restore"
got = {}
for root, dirs, files in os.walk(R):
    for f in files:
        p = os.path.join(root, f)
        got[os.path.relpath(p, R)] = open(p, "rb").read().decode(errors="replace")
if got != want:
    for k in sorted(set(got) | set(want)):
        if got.get(k) != want.get(k):
            fails.append(f"{k}: got {got.get(k)!r} want {want.get(k)!r}")
exp = "".join(f"{hashlib.sha256(want[k].encode()).hexdigest()}  ./{k}\n" for k in sorted(want, key=lambda s: ("./" + s).encode()))
try:
    m = open("/app/restore.sha256").read()
    if m != exp:
        fails.append(f"restore.sha256 mismatch:\n{m}\nexpected:\n{exp}")
    if subprocess.run(["sha256sum", "-c", "/app/restore.sha256"], cwd=R, capture_output=True).returncode != 0:
        fails.append("sha256sum -c fails")
except Exception as e:
    fails.append(f"restore.sha256: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
