#!/bin/bash
set -euo pipefail

# step: give deploy ownership of its home and everything in .ssh
chown deploy:deploy /home/deploy
chown -R deploy:deploy /home/deploy/.ssh

# step: lock down the home and .ssh directories
chmod 0750 /home/deploy
chmod 0700 /home/deploy/.ssh

# step: set file modes: private keys and authorized_keys 0600, public files 0644
find /home/deploy/.ssh -maxdepth 1 -type f -name 'id_*' ! -name '*.pub' -exec chmod 0600 {} +
chmod 0600 /home/deploy/.ssh/authorized_keys
find /home/deploy/.ssh -maxdepth 1 -type f \( -name '*.pub' -o -name known_hosts -o -name config \) -exec chmod 0644 {} +
ls -la /home/deploy /home/deploy/.ssh
