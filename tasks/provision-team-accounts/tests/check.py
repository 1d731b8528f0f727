import grp, os, pwd, stat, sys
fails = []
def g(name):
    try: return grp.getgrnam(name)
    except KeyError: fails.append(f"group {name} missing"); return None
dev, ops = g("developers"), g("ops")
if dev and dev.gr_gid != 3001: fails.append("developers gid != 3001")
if ops and ops.gr_gid != 3002: fails.append("ops gid != 3002")
want = {"alice": (3101, {"developers"}), "bob": (3102, {"developers", "ops"}), "carol": (3103, {"ops"})}
for user, (uid, groups) in want.items():
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        fails.append(f"user {user} missing"); continue
    if pw.pw_uid != uid: fails.append(f"{user} uid {pw.pw_uid}")
    if pw.pw_gid != uid: fails.append(f"{user} primary gid {pw.pw_gid}")
    try:
        if grp.getgrgid(pw.pw_gid).gr_name != user: fails.append(f"{user} primary group name wrong")
    except KeyError:
        fails.append(f"{user} primary group missing")
    if pw.pw_dir != f"/home/{user}": fails.append(f"{user} home {pw.pw_dir}")
    if pw.pw_shell != "/bin/bash": fails.append(f"{user} shell {pw.pw_shell}")
    sup = {gr.gr_name for gr in grp.getgrall() if user in gr.gr_mem}
    if sup != groups: fails.append(f"{user} supplementary groups {sup} != {groups}")
    try:
        st = os.stat(pw.pw_dir)
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o750 or not stat.S_ISDIR(st.st_mode):
            fails.append(f"{user} home owner/mode wrong: uid={st.st_uid} mode={oct(stat.S_IMODE(st.st_mode))}")
    except FileNotFoundError:
        fails.append(f"{user} home missing")
try:
    st = os.stat("/srv/projects")
    if st.st_uid != 0 or st.st_gid != 3001 or stat.S_IMODE(st.st_mode) != 0o2770:
        fails.append(f"/srv/projects uid={st.st_uid} gid={st.st_gid} mode={oct(stat.S_IMODE(st.st_mode))}")
except FileNotFoundError:
    fails.append("/srv/projects missing")
try:
    if pwd.getpwnam("legacy").pw_uid != 3000: fails.append("legacy user changed")
except KeyError:
    fails.append("legacy user removed")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
