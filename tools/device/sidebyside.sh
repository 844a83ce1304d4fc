#!/usr/bin/env bash
# memra and llama.cpp side by side in ONE run on the GPU machine, on the SAME GGUF files
# (issue 8 / PERF.md). Runs ON the device from the repo root with .device carried, SmolLM2
# staged in $HOME/models and llama.cpp built (or building) by tools/device/peer.sh.
#   1. synthetic llama3-8b q4_k_m / q8_0 / f16 with llama.cpp's RoPE layout (both engines load them)
#   2. memra-bench decode / prefill / ttft (512-token prompt, 128 new tokens, CUDA graphs on,
#      median of RUNS timed runs checked against an untimed reference run)
#   3. memra-bench peer llama.cpp: llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 3 on the same files
#   4. 64 streaming clients x 4 requests x 64 tokens (memra-bench load) against memra-server
#      and llama-server -np 64 on the q4_k_m file, and TTFT (512-token prompt, cold and cached)
#      and batch-1 decode (128 tokens, ignore_eos) through each server (memra-bench ttft|decode
#      --server)
# Every measurement is a row of ONE run id in $OUT/data.jsonl (docs/BENCH.md): copy it into
# reports/data/ and run `memra-bench report`. A markdown summary goes to $OUT/sidebyside.md;
# logs to $OUT/sbs-logs.tgz.
#   (the gates run in the lease queue that calls this script: tools/device/lease/queue.sh)
#   5. (step depth, not in the default list) decode at context depths SBS_DEPTHS (default
#      2048,8000) on the q4_k_m file, memra-bench decode --depth and llama-bench -d
# Env: SBS_STEPS (default "synth memra peer load"), RUNS (default 3). The lease queue (step
# load, lib.sh load_row) runs its load step only; docs/DEVICE.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/memra-sbs}"
LOG="$OUT/sbs-logs"
mkdir -p "$LOG"
BIN="${MEMRA_BIN:-$PWD/.device/bin}"
MODELS="$HOME/models"
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
STEPS="${SBS_STEPS:-synth memra peer load}"
RUNS="${RUNS:-3}"
export MEMRA_KERNEL_CACHE="$HOME/.cache/memra/kernels"
[ -n "${CUDA_HOME:-}" ] && export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
model() { echo "$MODELS/synth-llama3-8b-$1.gguf"; }
TAB="$OUT/sidebyside.md"
COMMIT=$(cat "$BIN/../COMMIT" 2>/dev/null || cat .device/COMMIT 2>/dev/null || echo unknown)

if has synth; then
  for d in q4_k_m q8_0 f16; do
    f=$(model "$d")
    [ -e "$f" ] || timeout 240 "$BIN/memra-bench" synth --shape llama3-8b --dtype "$d" --tokenizer-from "$SMOL" \
      --llamacpp-rope --out "$f.tmp" --quiet > "$LOG/synth-$d.log" 2>&1 && mv "$f.tmp" "$f"
  done
fi

RUN="${RUN:-h200-$(date -u +%Y%m%dT%H%M%SZ)}"
DATA="$OUT/data.jsonl"
export MEMRA_COMMIT="$COMMIT"
label() { case "$1" in smollm2) echo "--shape smollm2-135m --dtype Q4_1";; q4_k_m) echo "--shape llama3-8b --dtype Q4_K_M";;
  q8_0) echo "--shape llama3-8b --dtype Q8_0";; f16) echo "--shape llama3-8b --dtype F16";; esac; }
file() { if [ "$1" = smollm2 ]; then echo "$SMOL"; else model "$1"; fi; }
if has memra; then
  for name in smollm2 q4_k_m q8_0 f16; do
    for w in decode prefill ttft; do
      # shellcheck disable=SC2046
      timeout 300 "$BIN/memra-bench" "$w" "$(file "$name")" --device cuda:0 --prompt 512 --gen 128 \
        --runs "$RUNS" $(label "$name") --run "$RUN" --out "$DATA" --quiet > "$LOG/memra-$w-$name.txt" 2>&1
    done
  done
fi

if has peer; then
  tools/device/peer.sh wait > "$LOG/peer-build.txt" 2>&1
  for name in smollm2 q4_k_m q8_0 f16; do
    # shellcheck disable=SC2046
    timeout 300 "$BIN/memra-bench" peer llama.cpp "$(file "$name")" --llama-bin "$HOME/llama.cpp/build/bin" \
      --prompt 512 --gen 128 --reps 3 $(label "$name") --run "$RUN" --out "$DATA" > "$LOG/llama-bench-$name.txt" 2>&1
  done
fi

if has depth; then
  DEPTHS="${SBS_DEPTHS:-2048,8000}"
  f=$(model q4_k_m)
  # shellcheck disable=SC2046
  timeout 300 "$BIN/memra-bench" decode "$f" --device cuda:0 --prompt 512 --depth "$DEPTHS" --gen 128 \
    --runs "$RUNS" $(label q4_k_m) --run "$RUN" --out "$DATA" --quiet > "$LOG/memra-depth.txt" 2>&1
  tools/device/peer.sh wait > "$LOG/peer-build.txt" 2>&1
  # shellcheck disable=SC2046
  timeout 300 "$BIN/memra-bench" peer llama.cpp "$f" --llama-bin "$HOME/llama.cpp/build/bin" \
    --prompt 512 --gen 128 --depth "$DEPTHS" --reps 3 $(label q4_k_m) --run "$RUN" --out "$DATA" \
    > "$LOG/llama-bench-depth.txt" 2>&1
fi

LOADM="" LOADL=""
if has load; then
  f=$(model q4_k_m)
  MEMRA_MODELS="m=$f" MEMRA_ADDR="127.0.0.1:18090" MEMRA_DEVICE=cuda:0 MEMRA_MAX_RUNNING=64 \
    "$BIN/memra-server" --max-queue 512 --tenant-max-in-flight 128 --max-in-flight 128 \
    > "$LOG/memra-server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    curl -s -o /dev/null -w "%{http_code}" 127.0.0.1:18090/ready 2>/dev/null | grep -q 200 && break; sleep 0.5
  done
  # shellcheck disable=SC2046
  timeout 300 "$BIN/memra-bench" load --addr 127.0.0.1:18090 --model m --clients 64 --requests 4 \
    --max-tokens 64 --out "$DATA" --run "$RUN" --engine memra --model-file "$f" $(label q4_k_m) \
    --device cuda:0 > "$LOG/load-memra.json" 2>&1
  # shellcheck disable=SC2046
  for w in ttft decode; do
    # shellcheck disable=SC2046
    timeout 120 "$BIN/memra-bench" "$w" "$f" --server 127.0.0.1:18090 --served-model m --engine memra \
      --device cuda:0 --prompt 512 --gen 128 --runs "$RUNS" $(label q4_k_m) --run "$RUN" --out "$DATA" \
      --quiet > "$LOG/$w-server-memra.txt" 2>&1
  done
  kill -TERM "$pid"; wait "$pid"
  LOADM=$(python3 -c "import json; j=json.loads(open('$LOG/load-memra.json').read().strip().splitlines()[-1]); print('%.0f tok/s, %d errors' % (j.get('aggregate_tok_s', 0), j.get('errors', -1)))" 2>/dev/null || echo FAIL)
  if [ -x "$HOME/llama.cpp/build/bin/llama-server" ]; then
    "$HOME/llama.cpp/build/bin/llama-server" -m "$f" -ngl 99 -np 64 -c 65536 -fa on --port 18091 \
      > "$LOG/llama-server.log" 2>&1 &
    lpid=$!
    for _ in $(seq 1 240); do
      curl -s 127.0.0.1:18091/health 2>/dev/null | grep -q ok && break; sleep 0.5
    done
    # shellcheck disable=SC2046
    timeout 300 "$BIN/memra-bench" load --addr 127.0.0.1:18091 --model m --clients 64 --requests 4 \
      --max-tokens 64 --out "$DATA" --run "$RUN" --engine llama.cpp --model-file "$f" $(label q4_k_m) \
      --device cuda:0 > "$LOG/load-llama.json" 2>&1
    for w in ttft decode; do
      # shellcheck disable=SC2046
      timeout 120 "$BIN/memra-bench" "$w" "$f" --server 127.0.0.1:18091 --served-model m --engine llama.cpp \
        --engine-version "llama-cpp-python 0.3.36 (vendored llama.cpp)" --device cuda:0 --prompt 512 \
        --gen 128 --runs "$RUNS" $(label q4_k_m) --run "$RUN" --out "$DATA" --quiet \
        > "$LOG/$w-server-llama.txt" 2>&1
    done
    kill -TERM "$lpid"; wait "$lpid" 2>/dev/null
    LOADL=$(python3 -c "import json; j=json.loads(open('$LOG/load-llama.json').read().strip().splitlines()[-1]); print('%.0f tok/s, %d errors' % (j.get('aggregate_tok_s', 0), j.get('errors', -1)))" 2>/dev/null || echo FAIL)
  fi
fi

{
  echo "## memra vs llama.cpp, run $RUN ($(date -u +%FT%TZ), memra $COMMIT, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null))"
  echo
  cat "$LOG"/memra-*.txt 2>/dev/null
  echo
  echo "64 streaming clients x 4 requests x 64 tokens on q4_k_m: memra-server ${LOADM:-not run}; llama-server -np 64 ${LOADL:-not run}"
  echo
  echo "rows: $(wc -l < "$DATA" 2>/dev/null || echo 0) in $DATA (copy into reports/data/, then memra-bench report)"
} > "$TAB"
tar czf "$OUT/sbs-logs.tgz" -C "$OUT" sbs-logs && rm -rf "$LOG"
echo
cat "$TAB"
