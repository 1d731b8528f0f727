#!/bin/bash
set -euo pipefail

# step: restore the full snapshot of 2024-01-01 into /app/restore
mkdir -p /app/restore && tar -xzf /app/backups/full-20240101.tar.gz -C /app/restore --strip-components=1
find /app/restore -type f | sort

# step: apply the 2024-01-02 incremental, then that day's deletions
tar -xzf /app/backups/incr-20240102.tar.gz -C /app/restore --strip-components=1
while IFS= read -r p; do [ -n "$p" ] && rm -f -- "/app/restore/$p"; done < /app/backups/deleted-20240102.txt
find /app/restore -type d -empty -delete

# step: apply the 2024-01-03 incremental, then that day's deletions
tar -xzf /app/backups/incr-20240103.tar.gz -C /app/restore --strip-components=1
while IFS= read -r p; do [ -n "$p" ] && rm -f -- "/app/restore/$p"; done < /app/backups/deleted-20240103.txt
find /app/restore -mindepth 1 -type d -empty -delete
find /app/restore -type f | sort

# step: write the checksum manifest of the restored tree
cd /app/restore && find . -type f -print0 | xargs -0 sha256sum | LC_ALL=C sort -k2 > /app/restore.sha256
cd /app/restore && sha256sum -c /app/restore.sha256
