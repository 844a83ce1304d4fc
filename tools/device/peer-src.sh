#!/usr/bin/env bash
# Packs llama.cpp's source for the GPU machine (run HERE, with PyPI access): the vendored
# llama.cpp of the llama-cpp-python 0.3.36 sdist, without models/docs/media/benches, the
# examples and the non-CUDA ggml backends, into .stage/llama.tgz (~9 MB, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d)
# pip fetches and unpacks the sdist, then fails to prepare its metadata (no build isolation, so
# it does not first build cmake and ninja from source); --no-clean keeps the unpacked tree.
TMPDIR="$T" python3 -m pip download --no-clean --no-deps --no-binary :all: --no-build-isolation \
  llama-cpp-python==0.3.36 -d "$T" > "$T/pip.log" 2>&1 || true
SRC=$(find "$T" -maxdepth 3 -type d -name 'llama-cpp-python_*' | head -n 1)
[ -n "$SRC" ] && [ -d "$SRC/vendor/llama.cpp" ] || { echo "sdist not unpacked (see $T/pip.log)" >&2; exit 1; }
L="$SRC/vendor/llama.cpp"
rm -rf "$L/models" "$L/docs" "$L/media" "$L/benches"
find "$L/examples" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
for d in "$L"/ggml/src/ggml-*/; do
  case "$d" in *ggml-cpu/|*ggml-cuda/|*ggml-blas/) ;; *) rm -rf "$d" ;; esac
done
mkdir -p .stage
tar czf .stage/llama.tgz -C "$(dirname "$L")" llama.cpp
rm -rf "$T"
ls -l .stage/llama.tgz
