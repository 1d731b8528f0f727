#!/bin/bash
# Verifier: runs /tests/check.py (python3 stdlib only) and writes the reward.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app 2>/dev/null || cd /
if python3 /tests/check.py; then
  echo "PASS"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL"
  echo 0 > /logs/verifier/reward.txt
fi
