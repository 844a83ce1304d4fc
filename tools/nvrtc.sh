#!/usr/bin/env bash
# Fetches NVRTC 13.0.88 (the H200's version) from PyPI once into ${MEMRA_CACHE:-~/.cache/memra}/nvrtc
# and prints its lib folder (for LD_LIBRARY_PATH): the kernel compile checks (tools/test.sh) and
# the precompiled kernels (tools/device/pack.sh) need it on a machine without the CUDA toolkit.
set -euo pipefail
PY="${PYTHON:-python3}"
NVRTC_VERSION=13.0.88
NVRTC_DIR="${MEMRA_CACHE:-$HOME/.cache/memra}/nvrtc/$NVRTC_VERSION"
if [ ! -e "$NVRTC_DIR/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  mkdir -p "$NVRTC_DIR"
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
    "nvidia-cuda-nvrtc==$NVRTC_VERSION" -d "$NVRTC_DIR/wheel" >&2
  "$PY" -c 'import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]).extractall(sys.argv[2])' \
    "$NVRTC_DIR/wheel" "$NVRTC_DIR"
fi
echo "$NVRTC_DIR/nvidia/cu13/lib"
