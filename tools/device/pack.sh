#!/usr/bin/env bash
# Builds stripped release binaries of run-gen, memra-verify and memra-bench into .device/bin
# (git-ignored), ready to carry to the GPU machine:  tools/device/pack.sh
# Then, on the device (tool `run`, carry [".device"]):  tools/device/battery.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p memra-engine -p memra-verify -p memra-bench -p memra-server --bins
TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p .device/bin
for b in run-gen memra-verify memra-bench memra-server; do
  cp "$TARGET/release/$b" .device/bin/
  strip .device/bin/$b 2>/dev/null || true
done
# The commit the binaries were built from (the device copy's git metadata may be older).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)" > .device/COMMIT
ls -l .device/bin
du -sh .device
