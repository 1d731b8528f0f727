#!/usr/bin/env bash
# The test command: set up (idempotent), then the whole suite against a real Docker engine.
set -euo pipefail
cd "$(dirname "$0")"
bash setup.sh
python3 -m pytest -q -rs --durations=15 "$@"  # -rs: every skip with its reason; the 15 slowest tests
