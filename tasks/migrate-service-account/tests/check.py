import grp, os, pwd, stat, sys
fails = []
try:
    u = pwd.getpwnam("svc-app"); g = grp.getgrnam("svc-app")
    if (u.pw_uid, u.pw_gid, g.gr_gid) != (1600, 1600, 1600): fails.append(f"svc-app ids {u.pw_uid}/{u.pw_gid}/{g.gr_gid}")
    if u.pw_dir != "/var/lib/app" or u.pw_shell != "/usr/sbin/nologin": fails.append(f"svc-app home/shell {u.pw_dir} {u.pw_shell}")
except KeyError as e:
    fails.append(f"missing account/group: {e}")
SVC = ("svc-app", "svc-app")
want = {  # path: (user, group, mode)  mode None for symlinks
    "/srv/app": ("svc-app", "svc-app", 0o755), "/srv/app/bin": ("svc-app", "svc-app", 0o755),
    "/srv/app/bin/run.sh": ("svc-app", "svc-app", 0o755), "/srv/app/shared": ("svc-app", "svc-app", 0o2775),
    "/srv/app/shared/index.html": ("svc-app", "svc-app", 0o644), "/srv/app/shared/upload.txt": ("www-data", "svc-app", 0o664),
    "/srv/app/VERSION": ("root", "root", 0o644), "/srv/app/current": ("svc-app", "svc-app", None),
    "/var/lib/app": ("svc-app", "svc-app", 0o750), "/var/lib/app/cache": ("svc-app", "svc-app", 0o755),
    "/var/lib/app/cache/blob": ("svc-app", "svc-app", 0o644), "/var/lib/app/state.db": ("svc-app", "svc-app", 0o600),
    "/var/log/app": ("svc-app", "svc-app", 0o755), "/var/log/app/app.log": ("svc-app", "adm", 0o640),
    "/opt/other": ("legacyapp", "legacyapp", 0o755), "/opt/other/legacy-note.txt": ("legacyapp", "legacyapp", 0o644),
}
def name_u(uid):
    try: return pwd.getpwuid(uid).pw_name
    except KeyError: return str(uid)
def name_g(gid):
    try: return grp.getgrgid(gid).gr_name
    except KeyError: return str(gid)
for p, (wu, wg, wm) in want.items():
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        fails.append(f"{p} missing"); continue
    got = (name_u(st.st_uid), name_g(st.st_gid), None if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode))
    if got != (wu, wg, wm):
        fails.append(f"{p}: {got[0]}:{got[1]} {oct(got[2]) if got[2] is not None else 'link'} want {wu}:{wg} {oct(wm) if wm else 'link'}")
if os.path.islink("/srv/app/current") and os.readlink("/srv/app/current") != "/srv/app/bin/run.sh":
    fails.append("symlink target changed")
for root in ("/srv/app", "/var/lib/app", "/var/log/app"):
    for dp, dn, fn in os.walk(root):
        for n in dn + fn:
            st = os.lstat(os.path.join(dp, n))
            if st.st_uid == 1500 or st.st_gid == 1500: fails.append(f"{os.path.join(dp, n)} still legacyapp-owned")
if os.path.exists("/var/lib/app/.bashrc"): fails.append("skeleton files copied into /var/lib/app")
want_conf = """# app runtime settings
listen = 0.0.0.0:8080
run_as = svc-app
group = svc-app
data_dir = /var/lib/app
# legacyapp compatibility mode stays on until v3
legacy_mode = true
"""
try:
    if open("/etc/app/app.conf").read() != want_conf: fails.append("app.conf wrong:\n" + open("/etc/app/app.conf").read())
except FileNotFoundError:
    fails.append("app.conf missing")
try:
    lp = pwd.getpwnam("legacyapp")
    if lp.pw_uid != 1500: fails.append("legacyapp uid changed")
    if lp.pw_shell != "/usr/sbin/nologin": fails.append(f"legacyapp shell {lp.pw_shell}")
    sh = [l.split(":") for l in open("/etc/shadow") if l.startswith("legacyapp:")]
    if not sh or not sh[0][1].startswith("!") or len(sh[0][1]) < 10:
        fails.append("legacyapp password not locked (or hash removed)")
except KeyError:
    fails.append("legacyapp deleted")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
