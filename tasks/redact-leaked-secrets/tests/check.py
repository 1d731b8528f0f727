import os, stat, sys
fails = []
want_leaks = ["config/aws.ini:3", "config/aws.ini:4", "config/aws.ini:7", "config/deploy.yaml:3",
              ".env:3", ".env:5", "logs/http.log:2", "logs/http.log:4", "src/upload.py:4"]
want_leaks.sort(key=lambda s: (s.rsplit(":", 1)[0].encode(), int(s.rsplit(":", 1)[1])))
try:
    got = open("/app/leaks.txt").read().split()
    if got != want_leaks: fails.append(f"leaks.txt {got} != {want_leaks}")
except FileNotFoundError:
    fails.append("leaks.txt missing")
repl = {
    "AKIAIOSFODNN7EXAMPLE": "REDACTED", "AKIAJ2X4QW7ZP3LMN8RT": "REDACTED", "AKIAZ7Q3M5N8P2R4T6V8": "REDACTED",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "REDACTED", "9xT+Qm2bLr8/ZkP0vWc3YhN5sD7fGjA1eR4uIoLp": "REDACTED",
    "Sup3r$ecret-2024": "REDACTED", "mail!pass#9": "REDACTED",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl": "REDACTED", "tok_live_8f3k2m9x": "REDACTED",
}
O = "/tests/orig"
for root, dirs, files in os.walk(O):
    for f in files:
        rel = os.path.relpath(os.path.join(root, f), O)
        exp = open(os.path.join(root, f)).read()
        for a, b in repl.items():
            exp = exp.replace(a, b)
        p = os.path.join("/app/bundle", rel)
        try:
            if open(p).read() != exp: fails.append(f"{rel} content not as expected")
        except FileNotFoundError:
            fails.append(f"{rel} missing")
try:
    if stat.S_IMODE(os.stat("/app/bundle/.env").st_mode) != 0o600: fails.append(".env mode not 0600")
except FileNotFoundError:
    pass
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
