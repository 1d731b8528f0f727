import gzip, grp, os, re, stat, sys
D = "/var/log/myapp"
fails = []
def gen(tag, n):
    return "".join(f"2024-06-{10 - n:02d}T{h:02d}:00:00Z {tag} request {h * 7 + n} ok\n" for h in range(24)).encode()
want_files = {"app.log", "app.log.1", "app.log.2.gz", "app.log.3.gz", "worker.log"}
have = set(os.listdir(D)) if os.path.isdir(D) else set()
if have != want_files:
    fails.append(f"files in {D}: {sorted(have)}")
def rd(name, gz):
    try:
        return (gzip.open if gz else open)(f"{D}/{name}", "rb").read()
    except Exception as e:
        return f"ERR {e}"
if rd("app.log.1", False) != gen("live", 0): fails.append("app.log.1 is not the old live log")
if rd("app.log.2.gz", True) != gen("gen1", 1): fails.append("app.log.2.gz is not old app.log.1 (gzip)")
if rd("app.log.3.gz", True) != gen("gen2", 2): fails.append("app.log.3.gz is not old app.log.2.gz")
if rd("worker.log", False) != b"worker line\n": fails.append("worker.log changed")
try:
    st = os.stat(f"{D}/app.log")
    if st.st_size != 0 or stat.S_IMODE(st.st_mode) != 0o640 or st.st_uid != 0 or st.st_gid != grp.getgrnam("adm").gr_gid:
        fails.append(f"new app.log wrong: size={st.st_size} mode={oct(stat.S_IMODE(st.st_mode))} uid={st.st_uid} gid={st.st_gid}")
except FileNotFoundError:
    fails.append("new app.log missing")
C = "/etc/logrotate.d/myapp"
try:
    txt = open(C).read()
    if stat.S_IMODE(os.stat(C).st_mode) != 0o644: fails.append("config mode not 0644")
    m = re.search(r"^\s*(\S+)\s*\{(.*?)^\s*\}", txt, re.S | re.M)
    if not m or m.group(1) != "/var/log/myapp/*.log":
        fails.append("no stanza for /var/log/myapp/*.log")
    else:
        dirs = {" ".join(l.split()) for l in m.group(2).splitlines() if l.strip() and not l.strip().startswith("#")}
        need = {"daily", "rotate 3", "compress", "delaycompress", "missingok", "notifempty", "create 0640 root adm"}
        if not need <= dirs: fails.append(f"missing directives: {sorted(need - dirs)}")
        if any(d.startswith("rotate ") and d != "rotate 3" for d in dirs) or "nocompress" in dirs:
            fails.append("conflicting directives")
except FileNotFoundError:
    fails.append("logrotate config missing")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
