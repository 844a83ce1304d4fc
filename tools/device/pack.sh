#!/usr/bin/env bash
# Builds stripped release binaries of run-gen, memra-verify, memra-bench and memra-server into
# .device/bin (git-ignored) with precompiled kernels, ready to carry to the GPU machine:
#   tools/device/pack.sh          (stage.sh runs it; docs/DEVICE.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p memra-engine -p memra-verify -p memra-bench -p memra-server --bins
TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p .device/bin
for b in run-gen memra-verify memra-bench memra-server; do
  cp "$TARGET/release/$b" .device/bin/
  strip .device/bin/$b 2>/dev/null || true
done
# Precompiled kernels (cubin) for the H200 (sm_90a): every module and products variant the
# engine can launch there, so that a fresh machine neither runs NVRTC nor the driver's JIT
# (tools/device/lease/start.sh copies them into the kernel cache). PACK_KCACHE=0 skips it.
rm -rf .device/kcache
if [ "${PACK_KCACHE:-1}" != 0 ]; then
  NV="$(tools/nvrtc.sh)"   # NVRTC from PyPI (the H200's version)
  LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$TARGET/release/memra-bench" kernel-cache --arch sm_90a --out .device/kcache
  # Variants of products.cu, precompiled too (a lease compiling one in the process took > 240 s
  # in session 11): PACK_KVARS="t16:TILE_GROUP=16" writes .device/kvar/NAME/
  # products.cu = "#define TILE_GROUP 16" + products.cu (queue.sh's kvar passes MEMRA_KERNEL_DIR=
  # $HOME/dev/.device/kvar/NAME; the cache key is the source's hash, so the bytes must be these)
  # and its builds into .device/kcache (kernel-cache keeps the cubins already there: only the
  # products builds the variant changes are compiled).
  rm -rf .device/kvar
  for v in ${PACK_KVARS:-}; do
    n=${v%%:*}; d=${v#*:}
    mkdir -p ".device/kvar/$n"
    { echo "#define ${d%%=*} ${d#*=}"; cat kernels/cu/products.cu; } > ".device/kvar/$n/products.cu"
    MEMRA_KERNEL_DIR=".device/kvar/$n" LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$TARGET/release/memra-bench" kernel-cache --arch sm_90a --out .device/kcache
  done
fi
# The commit the binaries were built from (the device copy's git metadata may be older).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)" > .device/COMMIT
ls -l .device/bin
du -sh .device
