#!/bin/bash
set -euo pipefail

# step: create the team groups with fixed GIDs
groupadd -g 3001 developers
groupadd -g 3002 ops
getent group developers ops

# step: create the users from /app/team.csv
tail -n +2 /app/team.csv | while IFS=, read -r user uid groups; do
  groupadd -g "$uid" "$user"
  useradd -m -d "/home/$user" -s /bin/bash -u "$uid" -g "$uid" -G "${groups//;/,}" "$user"
  chmod 0750 "/home/$user"
  id "$user"
done

# step: create the setgid shared project directory
mkdir -p /srv/projects && chown root:developers /srv/projects && chmod 2770 /srv/projects
stat -c '%A %U:%G %n' /srv/projects
