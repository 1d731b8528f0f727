import hashlib, os, subprocess, sys, tarfile
def content(n, s):
    return "".join(f"{n} line {i} seed {s*i%997}\n" for i in range(40 + s)).encode()
old = {"api-2024-01.log": 1, "api-2024-03.log": 2, "worker-2024-05.log": 3, "db slow 2024-02.log": 6}
keep = {"worker-2024-06.log": 4, "api-2024-07.log": 5, "current.log": 7, "notes-2023.txt": 8, "old-config.log.bak": 9}
fails = []
tp = "/app/archive/logs-before-2024-06.tar.gz"
try:
    with tarfile.open(tp, "r:gz") as t:
        members = {m.name.lstrip("./") if m.name.startswith("./") else m.name: m for m in t.getmembers() if m.isfile()}
        names = sorted(m.name for m in t.getmembers() if m.isfile())
        if sorted(names) != sorted(old):
            fails.append(f"archive members {names} != {sorted(old)}")
        for n, s in old.items():
            if n in members and t.extractfile(members[n]).read() != content(n, s):
                fails.append(f"archived {n} content wrong")
except Exception as e:
    fails.append(f"cannot read tarball: {e}")
for n in old:
    if os.path.exists(f"/app/logs/{n}"):
        fails.append(f"old log {n} not deleted")
for n, s in keep.items():
    p = f"/app/logs/{n}"
    if not os.path.isfile(p) or open(p, "rb").read() != content(n, s):
        fails.append(f"{n} should be untouched")
sp = tp + ".sha256"
try:
    line = open(sp).read()
    h = hashlib.sha256(open(tp, "rb").read()).hexdigest()
    if line != f"{h}  logs-before-2024-06.tar.gz\n":
        fails.append(f"bad sha256 file: {line!r}")
    r = subprocess.run(["sha256sum", "-c", "logs-before-2024-06.tar.gz.sha256"], cwd="/app/archive", capture_output=True)
    if r.returncode != 0:
        fails.append("sha256sum -c fails")
except Exception as e:
    fails.append(f"sha256 file: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
