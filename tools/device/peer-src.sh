#!/usr/bin/env bash
# Packs llama.cpp's source for the GPU machine (run HERE, with PyPI access): the vendored
# llama.cpp of the llama-cpp-python 0.3.36 sdist, without models/docs/media/benches, the
# examples and the non-CUDA ggml backends, into .stage/llama.tgz (~9 MB, git-ignored).
# A wrapper over `memra-bench peer fetch [--out FILE]` (bench/src/peer_build.rs): the binary in
# $MEMRA_BIN when set, else built and run by cargo.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${MEMRA_BIN:-}" ] && [ -x "$MEMRA_BIN/memra-bench" ]; then
  "$MEMRA_BIN/memra-bench" peer fetch "$@"
else
  cargo run --release -q -p memra-bench --bin memra-bench -- peer fetch "$@"
fi
