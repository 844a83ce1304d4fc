#!/usr/bin/env bash
# CPU reference backend benchmark on the real SmolLM2-135M-Instruct (a benchmark, not a test):
# prefill of a PROMPT_LEN-token prompt and greedy decode of GEN tokens, the median of RUNS timed runs
# after an untimed reference run (memra-bench decode/prefill); appends the rows to
# reports/data/cpu-smollm2.jsonl (then `memra-bench report` regenerates the tables).
#   tools/bench-cpu.sh        (env: PROMPT_LEN=256 GEN=64 RUNS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT_LEN="${PROMPT_LEN:-256}"
GEN="${GEN:-64}"
RUNS="${RUNS:-3}"
MODEL="$(tools/fetch-models.sh)"
cargo build --release --quiet --bin memra-bench
BIN="${CARGO_TARGET_DIR:-target}/release/memra-bench"
RUN="cpu-$(date -u +%Y%m%dT%H%M%SZ)"
for w in decode prefill; do
  "$BIN" "$w" "$MODEL" --device cpu --prompt "$PROMPT_LEN" --gen "$GEN" --runs "$RUNS" \
    --shape smollm2-135m --dtype Q4_1 --run "$RUN" --out reports/data/cpu-smollm2.jsonl
done
