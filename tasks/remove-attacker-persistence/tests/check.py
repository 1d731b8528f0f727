import os, stat, subprocess, sys
fails = []
if os.path.lexists("/usr/local/bin/.sysupd"): fails.append(".sysupd still present")
for root in ("/usr/local", "/tmp", "/var/tmp", "/opt", "/root"):
    for dp, dn, fn in os.walk(root):
        for n in fn:
            p = os.path.join(dp, n)
            try:
                m = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID): fails.append(f"setuid/setgid file left: {p}")
for p in ("/usr/bin/passwd", "/usr/bin/su", "/usr/bin/chsh"):
    if os.path.exists(p) and not os.stat(p).st_mode & stat.S_ISUID: fails.append(f"{p} lost its setuid bit")
if not os.path.exists("/usr/local/bin/report-disk"): fails.append("legit /usr/local/bin/report-disk removed")
AK = "/root/.ssh/authorized_keys"
try:
    want = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAliceKeyAliceKeyAliceKey0001 alice@corp.example\n"
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBobKeyBobKeyBobKeyBobKey0002 bob@corp.example\n")
    if open(AK).read() != want: fails.append("authorized_keys not exactly the two admin keys")
    if stat.S_IMODE(os.stat(AK).st_mode) != 0o600: fails.append("authorized_keys mode")
except FileNotFoundError:
    fails.append("authorized_keys missing")
try:
    if open("/etc/cron.d/tmp-cleanup").read() != "SHELL=/bin/sh\n# clean old temp files\n17 3 * * * root find /tmp -mtime +7 -delete\n":
        fails.append("legit cron job changed")
except FileNotFoundError:
    fails.append("legit cron job removed")
try:
    if open("/etc/profile.d/corp-proxy.sh").read() != "export HTTP_PROXY=http://proxy.corp.example:3128\n":
        fails.append("corp-proxy.sh changed")
except FileNotFoundError:
    fails.append("corp-proxy.sh removed")
pw = [l.split(":") for l in open("/etc/passwd").read().splitlines() if l]
uid0 = [e[0] for e in pw if e[2] == "0"]
if uid0 != ["root"]: fails.append(f"uid 0 accounts: {uid0}")
names = {e[0] for e in pw}
for u in ("root", "daemon", "www-data", "nobody", "ops"):
    if u not in names: fails.append(f"account {u} missing")
root = [e for e in pw if e[0] == "root"]
if not root or root[0][5:7] != ["/root", "/bin/bash"]: fails.append("root entry changed")
for f in ("/etc/shadow", "/etc/group", "/etc/gshadow"):
    if os.path.exists(f) and any(l.startswith("sysupd:") for l in open(f)): fails.append(f"sysupd still in {f}")
sh = {l.split(":")[0] for l in open("/etc/shadow") if l.strip()}
if not {"root", "ops"} <= sh: fails.append("shadow entries removed")
r = subprocess.run(["grep", "-rlaE", r"203\.0\.113\.66|\.sysupd", "/etc", "/root", "/usr/local", "/var/spool/cron"], capture_output=True, text=True)
if r.stdout.strip(): fails.append(f"IOC still referenced in: {r.stdout.split()}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
