import datetime, os, re, stat, subprocess, sys, tarfile
fails = []
S = "/usr/local/bin/backup-appdata"
D = "/var/backups/appdata"
today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
arch = f"{D}/appdata-{today}.tar.gz"
want = {"config.json": b'{"name": "app", "version": 3}\n', "users.csv": b"id,user\n1,ann\n2,bob\n", "uploads/logo.png": b"PNGDATA\n"}
def check_archive(label):
    try:
        with tarfile.open(arch, "r:gz") as t:
            got = {}
            for m in t.getmembers():
                if m.isfile():
                    n = m.name[2:] if m.name.startswith("./") else m.name
                    got[n] = t.extractfile(m).read()
        if got != want:
            fails.append(f"{label}: archive members {sorted(got)} / content wrong")
    except Exception as e:
        fails.append(f"{label}: cannot read {arch}: {e}")
# 3. first run happened (check before re-running the script)
if not os.path.exists(arch):
    fails.append("today's archive was not created")
else:
    check_archive("existing archive")
if os.path.exists(f"{D}/appdata-20200101.tar.gz"):
    fails.append("old backup not pruned")
# 1. script
try:
    st = os.stat(S)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o755:
        fails.append(f"script owner/mode wrong: {st.st_uid} {oct(stat.S_IMODE(st.st_mode))}")
    # re-run from a clean state: it must recreate the dir, the archive and prune
    subprocess.run(["rm", "-rf", D])
    os.makedirs(D); open(f"{D}/appdata-20190101.tar.gz", "w").write("x")
    os.utime(f"{D}/appdata-20190101.tar.gz", (1546300800, 1546300800))
    open(f"{D}/appdata-keep.tar.gz", "w").write("x")
    r = subprocess.run([S], cwd="/", capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        fails.append(f"script exit {r.returncode}: {r.stderr[-300:]}")
    check_archive("re-run")
    if os.path.exists(f"{D}/appdata-20190101.tar.gz"): fails.append("re-run did not prune old backup")
    if not os.path.exists(f"{D}/appdata-keep.tar.gz"): fails.append("re-run deleted a recent file")
except FileNotFoundError:
    fails.append("backup script missing")
# 2. cron entry
C = "/etc/cron.d/appdata-backup"
try:
    st = os.stat(C)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o644:
        fails.append("cron file owner/mode wrong")
    jobs = [l.split(None, 6) for l in open(C).read().splitlines()
            if l.strip() and not l.lstrip().startswith("#") and not re.match(r"^\s*[A-Za-z_]+\s*=", l)]
    ok = any(len(j) == 7 and j[0] in ("30",) and j[1] in ("2", "02") and j[2:5] == ["*", "*", "*"]
             and j[5] == "root" and j[6].strip() == S for j in jobs)
    if not ok or len(jobs) != 1:
        fails.append(f"cron entry wrong: {jobs}")
    if not open(C).read().endswith("\n"):
        fails.append("cron file must end with a newline")
except FileNotFoundError:
    fails.append("cron file missing")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
