#!/usr/bin/env bash
# Device microbenchmark of the v2 products (runs ON the GPU machine from the repo root, with
# .device carried): memra-bench kernels over the llama3-8b and SmolLM2 shapes. Table printed last,
# JSON in $OUT. Env: KB_DTYPES, KB_SHAPES, KB_M, KB_LAUNCHES, KB_REPS pass through.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/memra-kernels}"
mkdir -p "$OUT"
BIN="${MEMRA_BIN:-$PWD/.device/bin}"
export MEMRA_KERNEL_CACHE="$HOME/.cache/memra/kernels"
if [ -n "${CUDA_HOME:-}" ]; then
  export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
"$BIN/memra-bench" kernels \
  --dtypes "${KB_DTYPES:-q4_k,q6_k,q8_0,q4_1,f16}" \
  --shapes "${KB_SHAPES:-4096x4096,1024x4096,14336x4096,4096x14336,49152x4096,576x576,1536x576,576x1536,49152x576}" \
  --m "${KB_M:-1,2,4,8,16,32,64,512}" \
  --launches "${KB_LAUNCHES:-}" --reps "${KB_REPS:-20}" --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.txt"
