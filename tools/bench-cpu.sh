#!/usr/bin/env bash
# CPU reference backend benchmark on the real SmolLM2-135M-Instruct (a benchmark, not a test):
# prefill of a PROMPT_LEN-token prompt and greedy decode of GEN tokens, RUNS times after one warm-up;
# prints the median prefill and decode tok/s and appends every run to reports/data/cpu-smollm2.jsonl.
#   tools/bench-cpu.sh [THREADS]        (env: PROMPT_LEN=256 GEN=64 RUNS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-0}"
PROMPT_LEN="${PROMPT_LEN:-256}"
GEN="${GEN:-64}"
RUNS="${RUNS:-3}"
MODEL="$(tools/fetch-models.sh)"
cargo build --release --quiet --bin run-gen
BIN="${CARGO_TARGET_DIR:-target}/release/run-gen"
IDS=$(python3 -c "print(','.join(str(100 + i * 7 % 40000) for i in range($PROMPT_LEN)))")
mkdir -p reports/data
out=()
for i in $(seq 0 "$RUNS"); do
  j=$("$BIN" "$MODEL" --prompt-ids "$IDS" --max-tokens "$GEN" --ignore-eos --threads "$THREADS" --json)
  [ "$i" -eq 0 ] && continue  # warm-up
  out+=("$j")
  python3 -c "import json,sys,platform,datetime; j=json.loads(sys.argv[1]); print(json.dumps({'date': datetime.datetime.utcnow().isoformat()+'Z', 'host_cpus': $(nproc), 'threads': $THREADS, 'prompt_len': $PROMPT_LEN, 'gen': $GEN, 'prefill_tok_s': j['prompt_tok_per_s'], 'decode_tok_s': j['decode_tok_per_s']}))" "$j" >> reports/data/cpu-smollm2.jsonl
done
printf '%s\n' "${out[@]}" | python3 -c "
import json, sys, statistics
runs = [json.loads(l) for l in sys.stdin if l.strip()]
p = statistics.median(r['prompt_tok_per_s'] for r in runs)
d = statistics.median(r['decode_tok_per_s'] for r in runs)
print(f'SmolLM2-135M Q4_1 on the CPU ({len(runs)} runs, threads=$THREADS): prefill {p:.1f} tok/s ($PROMPT_LEN-token prompt), decode {d:.1f} tok/s ($GEN tokens)')
"
