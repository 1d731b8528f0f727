#!/bin/bash
set -euo pipefail

# step: create the svc-app group and user (home exists, no skeleton)
groupadd -g 1600 svc-app
useradd -u 1600 -g svc-app -d /var/lib/app -M -s /usr/sbin/nologin svc-app
id svc-app

# step: move ownership from legacyapp to svc-app without following links, keeping modes
for d in /srv/app /var/lib/app /var/log/app; do
  find "$d" -user legacyapp -print0 | while IFS= read -r -d '' f; do
    mode=$(stat -c '%a' "$f"); chown -h svc-app "$f"; [ -L "$f" ] || chmod "$mode" "$f"; done
  find "$d" -group legacyapp -print0 | while IFS= read -r -d '' f; do
    mode=$(stat -c '%a' "$f"); chgrp -h svc-app "$f"; [ -L "$f" ] || chmod "$mode" "$f"; done
done
find /srv/app /var/lib/app /var/log/app -printf '%M %u:%g %p\n'

# step: point the app config at the new account
sed -i -E 's/^run_as = legacyapp$/run_as = svc-app/; s/^group = legacyapp$/group = svc-app/' /etc/app/app.conf
cat /etc/app/app.conf

# step: lock the old account and remove its login shell
usermod -L -s /usr/sbin/nologin legacyapp
getent passwd legacyapp
