#!/bin/bash
set -euo pipefail

# step: list images whose hash does not match SHA256SUMS
cd /app/firmware && { sha256sum -c SHA256SUMS 2>/dev/null || true; } | awk -F': ' '$2 != "OK" {print $1}' | sort > /app/corrupted.txt
cat /app/corrupted.txt

# step: restore corrupted images from verified mirror copies; record the rest as unrepairable
: > /app/unrepairable.txt
while IFS= read -r n; do
  want=$(awk -v n="$n" '$2 == n {print $1}' /app/firmware/SHA256SUMS)
  if [ -f "/app/mirror/$n" ] && [ "$(sha256sum "/app/mirror/$n" | cut -d' ' -f1)" = "$want" ]; then
    cp "/app/mirror/$n" "/app/firmware/$n"; echo "restored $n"
  else
    echo "$n" >> /app/unrepairable.txt
  fi
done < /app/corrupted.txt
sort -o /app/unrepairable.txt /app/unrepairable.txt

# step: record the final verification
cd /app/firmware && { sha256sum -c SHA256SUMS > /app/verify.log 2>&1 || true; }
cat /app/verify.log
