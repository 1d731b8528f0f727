#!/bin/bash
set -e
groupadd -g 1500 legacyapp
useradd -u 1500 -g 1500 -d /home/legacyapp -m -s /bin/bash legacyapp
echo 'legacyapp:Winter2019!' | chpasswd
mkdir -p /srv/app/bin /srv/app/shared /var/lib/app/cache /var/log/app /etc/app /opt/other
printf '#!/bin/sh\necho app\n' > /srv/app/bin/run.sh
printf 'static\n' > /srv/app/shared/index.html
printf 'root owned\n' > /srv/app/VERSION
printf 'state\n' > /var/lib/app/state.db
printf 'c\n' > /var/lib/app/cache/blob
printf 'log\n' > /var/log/app/app.log
printf 'www\n' > /srv/app/shared/upload.txt
ln -s /srv/app/bin/run.sh /srv/app/current
printf 'outside\n' > /opt/other/legacy-note.txt
chown -R legacyapp:legacyapp /srv/app /var/lib/app /var/log/app /opt/other
chown root:root /srv/app/VERSION
chown www-data:legacyapp /srv/app/shared/upload.txt
chown -h legacyapp:legacyapp /srv/app/current
chown legacyapp:adm /var/log/app/app.log
chmod 0755 /srv/app/bin/run.sh; chmod 2775 /srv/app/shared; chmod 0600 /var/lib/app/state.db
chmod 0640 /var/log/app/app.log; chmod 0750 /var/lib/app; chmod 0664 /srv/app/shared/upload.txt
cat > /etc/app/app.conf <<'CONF'
# app runtime settings
listen = 0.0.0.0:8080
run_as = legacyapp
group = legacyapp
data_dir = /var/lib/app
# legacyapp compatibility mode stays on until v3
legacy_mode = true
CONF
