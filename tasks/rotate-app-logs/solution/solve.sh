#!/bin/bash
set -euo pipefail

# step: discard generation 3 and shift app.log.2.gz to app.log.3.gz
mv -f /var/log/myapp/app.log.2.gz /var/log/myapp/app.log.3.gz

# step: compress app.log.1 into app.log.2.gz
gzip -c /var/log/myapp/app.log.1 > /var/log/myapp/app.log.2.gz && rm -f /var/log/myapp/app.log.1

# step: move the live log to app.log.1 and create a fresh app.log (0640 root:adm)
mv /var/log/myapp/app.log /var/log/myapp/app.log.1
install -m 0640 -o root -g adm /dev/null /var/log/myapp/app.log
ls -l /var/log/myapp

# step: install the logrotate configuration
cat > /etc/logrotate.d/myapp <<'CONF'
/var/log/myapp/*.log {
    daily
    rotate 3
    compress
    delaycompress
    missingok
    notifempty
    create 0640 root adm
}
CONF
chmod 0644 /etc/logrotate.d/myapp
