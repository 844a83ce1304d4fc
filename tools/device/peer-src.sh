#!/usr/bin/env bash
# Packs llama.cpp's source for the GPU machine (run HERE, with PyPI access): the vendored
# llama.cpp of the llama-cpp-python 0.3.36 sdist, without models/docs/media/benches, the
# examples and the non-CUDA ggml backends, into .stage/llama.tgz (~9 MB, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
T=$(mktemp -d)
# pip fails while building the sdist's metadata but leaves the sdist in its unpack folder.
TMPDIR="$T" python3 -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$T" \
  > "$T/pip.log" 2>&1 || true
SDIST=$(find "$T" -name 'llama_cpp_python-0.3.36.tar.gz' | head -n 1)
[ -n "$SDIST" ] || { echo "sdist not found (see $T/pip.log)" >&2; exit 1; }
tar xzf "$SDIST" -C "$T"
L="$T/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$L/models" "$L/docs" "$L/media" "$L/benches"
find "$L/examples" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
for d in "$L"/ggml/src/ggml-*/; do
  case "$d" in *ggml-cpu/|*ggml-cuda/|*ggml-blas/) ;; *) rm -rf "$d" ;; esac
done
mkdir -p .stage
tar czf .stage/llama.tgz -C "$(dirname "$L")" llama.cpp
rm -rf "$T"
ls -l .stage/llama.tgz
