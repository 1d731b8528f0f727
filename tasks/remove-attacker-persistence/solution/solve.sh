#!/bin/bash
set -euo pipefail

# step: remove the setuid shell and any other setuid/setgid file in the attacker-writable trees
find /usr/local /tmp /var/tmp /opt /root -xdev -type f -perm /6000 -print -delete

# step: keep only the admins' keys in root's authorized_keys
python3 - <<'PY'
admins = set(open("/app/admins.txt").read().split())
p = "/root/.ssh/authorized_keys"
lines = open(p).read().splitlines(keepends=True)
keep = [l for l in lines if l.split() and l.split()[-1] in admins]
open(p, "w").write("".join(keep))
print("".join(keep), end="")
PY
chmod 0600 /root/.ssh/authorized_keys

# step: delete the cron job that calls the attacker
{ grep -lrE '203\.0\.113\.66|\.sysupd' /etc/cron.d /etc/crontab /var/spool/cron 2>/dev/null || true; } | xargs -r rm -v

# step: remove the extra UID-0 account
sed -i '/^sysupd:/d' /etc/passwd /etc/shadow /etc/group /etc/gshadow
awk -F: '$3 == 0' /etc/passwd

# step: remove the phone-home login hook
{ grep -lrE '203\.0\.113\.66' /etc/profile.d /etc/profile /etc/bash.bashrc /root/.bashrc /root/.profile 2>/dev/null || true; } | xargs -r rm -v
