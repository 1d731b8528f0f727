#!/bin/bash
set -euo pipefail

# step: build the tarball of *.log files modified before 2024-06-01 UTC (bare member names)
mkdir -p /app/archive
cd /app/logs && find . -maxdepth 1 -type f -name '*.log' ! -newermt '2024-06-01 00:00:00 UTC' -printf '%P\0' | tar --null -czf /app/archive/logs-before-2024-06.tar.gz -T -
tar -tzvf /app/archive/logs-before-2024-06.tar.gz

# step: delete the archived originals (only those present in the tarball)
cd /app/logs && tar -tzf /app/archive/logs-before-2024-06.tar.gz | while IFS= read -r f; do rm -v -- "/app/logs/$f"; done

# step: write the sha256sum file for the tarball
cd /app/archive && sha256sum logs-before-2024-06.tar.gz > logs-before-2024-06.tar.gz.sha256 && sha256sum -c logs-before-2024-06.tar.gz.sha256
