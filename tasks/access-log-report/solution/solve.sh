#!/bin/bash
set -euo pipefail

# step: top 5 client IPs
mkdir -p /app/report
awk '{print $1}' /app/access.log | LC_ALL=C sort | uniq -c | awk '{print $1, $2}' | LC_ALL=C sort -k1,1nr -k2,2 | head -n 5 > /app/report/top_ips.txt
cat /app/report/top_ips.txt

# step: requests per status code as JSON
mkdir -p /app/report
awk '{print $9}' /app/access.log | sort | uniq -c | jq -Rn '[inputs | capture("^\\s*(?<n>[0-9]+) (?<code>[0-9]+)$") | {(.code): (.n | tonumber)}] | add' > /app/report/status_codes.json
cat /app/report/status_codes.json

# step: 5xx errors per path
mkdir -p /app/report
{ echo "path,errors"; awk '$9 ~ /^5/ {print $7}' /app/access.log | sort | uniq -c | awk '{print $2","$1}' | LC_ALL=C sort -t, -k2,2nr -k1,1; } > /app/report/errors_by_path.csv
cat /app/report/errors_by_path.csv
