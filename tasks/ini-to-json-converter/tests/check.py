import json, os, subprocess, sys, tempfile
fails = []
want_legacy = {
    "global": {"name": "billing", "debug": False},
    "server": {"host": "0.0.0.0", "port": 8080, "url": "http://billing.internal:8080/api", "workers": 8, "tls": True, "banner": "Hello = World"},
    "database": {"dsn": "postgres://billing@db/billing?sslmode=require", "pool_size": -1, "password": "0123", "read_only": False},
}
def expect_text(obj):
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"
try:
    got = open("/app/config.json").read()
    if json.loads(got) != want_legacy: fails.append(f"config.json content wrong: {got}")
    elif got != expect_text(want_legacy): fails.append("config.json formatting differs from json.dump(indent=2, sort_keys=True)")
except Exception as e:
    fails.append(f"config.json: {e}")
hidden = """   # comment with = sign
; another: comment
Top = 1
[ A ]
Key1 : value:with:colons
key2=  "yes"
key3 = On
key4 = 12abc
key5 = 007
key6 = -42
key7 = "-5"
KEY1 = override
empty =
[b]
x=1
[A]
late = true
"""
want_hidden = {"global": {"top": 1},
               "A": {"key1": "override", "key2": "yes", "key3": True, "key4": "12abc", "key5": 7, "key6": -42, "key7": "-5", "empty": "", "late": True},
               "b": {"x": 1}}
d = tempfile.mkdtemp()
open(f"{d}/in.ini", "w").write(hidden)
r = subprocess.run([sys.executable, "/app/ini2json.py", f"{d}/in.ini", f"{d}/out.json"], capture_output=True, text=True, timeout=20)
if r.returncode != 0:
    fails.append(f"converter failed: {r.stderr[-300:]}")
else:
    try:
        got = open(f"{d}/out.json").read()
        if json.loads(got) != want_hidden: fails.append(f"hidden input converted wrong: {got}")
        elif got != expect_text(want_hidden): fails.append("hidden output formatting wrong")
    except Exception as e:
        fails.append(f"hidden output: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
