import hashlib, os, pwd, grp, stat, sys
fails = []
try:
    uid = pwd.getpwnam("deploy").pw_uid; gid = grp.getgrnam("deploy").gr_gid
except KeyError:
    print("FAIL: deploy missing"); sys.exit(1)
want = {"/home/deploy": 0o750, "/home/deploy/.ssh": 0o700,
        "/home/deploy/.ssh/id_ed25519": 0o600, "/home/deploy/.ssh/id_rsa_legacy": 0o600,
        "/home/deploy/.ssh/authorized_keys": 0o600, "/home/deploy/.ssh/id_ed25519.pub": 0o644,
        "/home/deploy/.ssh/id_rsa_legacy.pub": 0o644, "/home/deploy/.ssh/known_hosts": 0o644,
        "/home/deploy/.ssh/config": 0o644}
for p, m in want.items():
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        fails.append(f"{p} missing"); continue
    if (st.st_uid, st.st_gid) != (uid, gid): fails.append(f"{p} owner {st.st_uid}:{st.st_gid}")
    if stat.S_IMODE(st.st_mode) != m: fails.append(f"{p} mode {oct(stat.S_IMODE(st.st_mode))} want {oct(m)}")
if os.path.isdir("/home/deploy/.ssh") and sorted(os.listdir("/home/deploy/.ssh")) != sorted(os.path.basename(p) for p in want if p.count("/") == 4):
    fails.append(f"files added/removed: {sorted(os.listdir('/home/deploy/.ssh'))}")
try:
    if "admin@laptop" not in open("/home/deploy/.ssh/authorized_keys").read(): fails.append("authorized_keys content changed")
    if "BEGIN OPENSSH PRIVATE KEY" not in open("/home/deploy/.ssh/id_ed25519").read(): fails.append("private key content changed")
except FileNotFoundError:
    pass
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
