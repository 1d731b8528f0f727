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
python3 -m pip install -q --disable-pip-version-check -r "$req"
if [ "$req" = requirements-cpu.txt ]; then
  python3 -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python3 common.py docker-up
