#!/usr/bin/env bash
# Set up a fresh Debian machine (root) or a laptop with Docker: system packages, Python
# packages, a running Docker engine and the offline base image. Idempotent; fast when done.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
fi
req=requirements-cpu.txt
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && req=requirements.txt
# flash-attn and causal-conv1d build against the installed torch (no build isolation), so they go
# second; if they don't build, 02 pads rows instead of packing them and says which is missing.
src='^(flash-attn|causal-conv1d)=='
python3 -m pip install -q --disable-pip-version-check -r <(grep -Ev "$src" "$req")
if grep -Eq "$src" "$req"; then
  python3 -m pip install -q --disable-pip-version-check --no-build-isolation $(grep -E "$src" "$req" | cut -d' ' -f1) \
    || echo "setup: flash-attn / causal-conv1d did not build; 02 will pad rows instead of packing them" >&2
fi
if [ "$req" = requirements-cpu.txt ]; then
  python3 -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python3 common.py docker-up
