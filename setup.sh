#!/usr/bin/env bash
# Set up a fresh Debian machine (root) or a laptop with Docker: system packages, Python
# packages, a running Docker engine and the offline base image. Idempotent; fast when done.
# An engine it starts itself (root, none answering) keeps its data on a loopback btrfs file with
# simple quotas (Linux 6.7+), so each container's storage cap is the kernel's (btrfs-progs; see
# docs/environment.md).
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null \
     || ! command -v mkfs.btrfs >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap btrfs-progs >/dev/null
  fi
fi
req=requirements-cpu.txt
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && req=requirements.txt
# flash-attn and causal-conv1d build against the installed torch (no build isolation), so they go
# second. Without them (or when they build but don't import) 02 cannot pack rows and Qwen3.5's
# linear attention runs its torch fallback, >10x slower at 32k tokens: set-up stops unless
# RETERM_NO_KERNELS=1 says to go on without them (02 then needs --batching pad).
# MAX_JOBS: parallel compiler jobs of the flash-attn build, one per 16 GB of memory at most
# (each nvcc job takes several GB; ninja's default, one per core, runs 8-core nodes out of memory).
src='^(flash-attn|causal-conv1d)=='
python3 -m pip install -q --disable-pip-version-check -r <(grep -Ev "$src" "$req")
if grep -Eq "$src" "$req"; then
  mem_gb=$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 16)
  jobs=$(( mem_gb / 16 < $(nproc) ? mem_gb / 16 : $(nproc) ))
  export MAX_JOBS="${MAX_JOBS:-$(( jobs > 0 ? jobs : 1 ))}"
  if ! { python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
           $(grep -E "$src" "$req" | cut -d' ' -f1) \
         && python3 -c "import flash_attn, causal_conv1d, fla"; }; then
    msg="setup: flash-attn / causal-conv1d did not build or import (see above; MAX_JOBS=$MAX_JOBS)"
    if [ "${RETERM_NO_KERNELS:-0}" != 1 ]; then
      echo "$msg. Fix the build (CUDA toolkit matching torch, lower MAX_JOBS), or rerun with" \
           "RETERM_NO_KERNELS=1 to go on without them (02 then needs --batching pad)" >&2
      exit 1
    fi
    echo "$msg; going on without them (RETERM_NO_KERNELS=1): run 02 with --batching pad" >&2
  fi
fi
if [ "$req" = requirements-cpu.txt ]; then
  python3 -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python3 common.py docker-up
