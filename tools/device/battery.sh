#!/usr/bin/env bash
# The device battery (runs ON the GPU machine, from the repo root, after tools/device/pack.sh
# here and with .device carried). Logs go to $OUT (the device tool's output folder); a short
# table is printed last.
#   nvidia-smi; memra-verify kernels; synthetic models into $HOME/models if absent;
#   memra-verify invariance (SmolLM2, synthetic llama3-8b q4_k_m); memra-verify graph (CUDA graph
#   vs plain bits, device vs host token selection; SmolLM2, llama3-8b q4_k_m); memra-verify tokens
#   (SmolLM2); run-gen --device cuda --json tok/s (512-token prompt, 128 new tokens) for SmolLM2
#   and synthetic llama3-8b at q4_k_m, q8_0, f16 (CUDA graphs on), plus SmolLM2 and q4_k_m with
#   --no-cuda-graph and with seeded top-k sampling; gemma: invariance and graph on a tiny random
#   gemma3 (sliding window 4), and on Gemma 3 270M when staged: invariance, graph, tokens vs
#   verify/fixtures/gemma3-270m-reference.json, run-gen tok/s; moe: invariance and graph on a tiny
#   random qwen3moe, then the synthetic qwen3-30b-a3b q4_k_m (run-gen tok/s); long (issue 11): a
#   128k-context llama3-8b q4_k_m, invariance at an 8,192-token prompt per KV format (f16, bf16,
#   q8_0), serve-invariance over a 5,700-token shared context (f16, q8_0), the cached-turn TTFT (5,700 + 50 tokens) and decode at depth 8,192 / 32,768 per format.
# Needs $HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf staged (docs/DEVICE.md); Gemma 3 270M
# ($HOME/models/gemma-3-270m-q4_k_m.gguf) is optional.
# Env: BATTERY_STEPS (default "smi kernels synth inv graph tokens speed"), BATTERY_SYNTH (llama3-8b
# dtypes to generate/measure, default "q4_k_m q8_0 f16").
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/memra-battery}"
LOG="$OUT/logs"
mkdir -p "$LOG"
BIN="${MEMRA_BIN:-$PWD/.device/bin}"
MODELS="$HOME/models"
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="$MODELS/gemma-3-270m-q4_k_m.gguf"
# The GGUF whose tokenizer synthetic models copy (SmolLM2, or a small file carrying its tokenizer).
TOKSRC="${BATTERY_TOKENIZER:-$SMOL}"
STEPS="${BATTERY_STEPS:-smi kernels synth inv graph tokens gemma serve server speed}"
SYNTH="${BATTERY_SYNTH:-q4_k_m q8_0 f16}"
export MEMRA_KERNEL_CACHE="$HOME/.cache/memra/kernels"
if [ -n "${CUDA_HOME:-}" ]; then
  export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mkdir -p "$MODELS"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }
# run NAME TIMEOUT CMD...: logs to $OUT/NAME.log, records ALL GREEN / exit status.
run() {
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  local dt=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then row "$name" "ok (${dt}s)"; else row "$name" "FAIL rc=$rc (${dt}s): $(tail -n 3 "$LOG/$name.log" | tr '\n' ' ' | cut -c1-160)"; fi
  return $rc
}
llama() { echo "$MODELS/synth-llama3-8b-$1.gguf"; }

if has smi; then nvidia-smi > "$LOG/nvidia-smi.txt" 2>&1; head -n 12 "$LOG/nvidia-smi.txt"; fi
[ -e "$SMOL" ] || row "SmolLM2" "MISSING $SMOL (stage it, docs/DEVICE.md)"

if has kernels; then run verify-kernels 300 "$BIN/memra-verify" kernels --device cuda:0; fi

if has synth; then
  for d in $SYNTH; do
    f=$(llama "$d")
    if [ ! -e "$f" ]; then
      run "synth-llama3-8b-$d" 240 "$BIN/memra-bench" synth --shape llama3-8b --dtype "$d" \
        --tokenizer-from "$TOKSRC" --out "$f.tmp" --quiet && mv "$f.tmp" "$f"
    fi
  done
fi

if has inv; then
  [ -e "$SMOL" ] && run invariance-smollm2 240 "$BIN/memra-verify" invariance --device cuda:0 "$SMOL" --max-m 64
  f=$(llama q4_k_m)
  [ -e "$f" ] && run invariance-llama3-8b-q4_k_m 300 "$BIN/memra-verify" invariance --device cuda:0 "$f" --max-m 64
fi

if has graph; then
  [ -e "$SMOL" ] && run graph-smollm2 240 "$BIN/memra-verify" graph --device cuda:0 "$SMOL" --max-m 64
  f=$(llama q4_k_m)
  [ -e "$f" ] && run graph-llama3-8b-q4_k_m 300 "$BIN/memra-verify" graph --device cuda:0 "$f" --max-m 64
fi

if has tokens && [ -e "$SMOL" ]; then
  run tokens-smollm2 180 "$BIN/memra-verify" tokens --device cuda:0 "$SMOL" \
    --fixture verify/fixtures/smollm2-135m-reference.json
fi

if has gemma; then
  # The tiny random gemma3 (window 4, a global layer every 2): windowed attention, GeGLU and the
  # scales on the device without a model file.
  run invariance-tiny-gemma3 240 "$BIN/memra-verify" invariance --device cuda:0 --tiny gemma3 --max-m 64
  run graph-tiny-gemma3 240 "$BIN/memra-verify" graph --device cuda:0 --tiny gemma3 --max-m 64
  if [ -e "$GEMMA" ]; then
    # A 600-token prompt: the local layers' 512-position window slides.
    run invariance-gemma3-270m 300 "$BIN/memra-verify" invariance --device cuda:0 "$GEMMA" --max-m 64 --prompt-len 600
    run graph-gemma3-270m 300 "$BIN/memra-verify" graph --device cuda:0 "$GEMMA" --max-m 64
    run tokens-gemma3-270m 240 "$BIN/memra-verify" tokens --device cuda:0 "$GEMMA" \
      --fixture verify/fixtures/gemma3-270m-reference.json
  else
    row "Gemma 3 270M" "not staged ($GEMMA): tiny gemma3 only"
  fi
fi

if has moe; then
  # The tiny random qwen3moe (8 experts, top 3): routing, expert products and the combine.
  run invariance-tiny-qwen3moe 240 "$BIN/memra-verify" invariance --device cuda:0 --tiny qwen3moe --max-m 64
  run graph-tiny-qwen3moe 240 "$BIN/memra-verify" graph --device cuda:0 --tiny qwen3moe --max-m 64
  f="$MODELS/synth-qwen3-30b-a3b-q4_k_m.gguf"
  if [ ! -e "$f" ]; then
    run synth-qwen3-30b-a3b 400 "$BIN/memra-bench" synth --shape qwen3-30b-a3b --dtype q4_k_m \
      --tokenizer-from "$TOKSRC" --out "$f.tmp" --quiet && mv "$f.tmp" "$f"
  fi
  [ -e "$f" ] && run invariance-qwen3-30b-a3b 400 "$BIN/memra-verify" invariance --device cuda:0 "$f" --max-m 16
fi

if has long; then
  # Issue 11: the 128k-context synthetic llama3-8b (Llama-3.1 rope scaling, as llama.cpp reads it).
  f="$MODELS/synth-llama3-8b-q4_k_m-128k.gguf"
  if [ ! -e "$f" ]; then
    run synth-llama3-8b-128k 240 "$BIN/memra-bench" synth --shape llama3-8b --dtype q4_k_m --ctx 131072 \
      --llamacpp-rope --tokenizer-from "$TOKSRC" --out "$f.tmp" --quiet && mv "$f.tmp" "$f"
  fi
  if [ -e "$f" ]; then
    for kv in f16 bf16 q8_0; do
      run "invariance-8k-$kv" 300 "$BIN/memra-verify" --kv-dtype "$kv" invariance "$f" --device cuda:0 \
        --prompt-len 8192 --max-m 8
    done
    for kv in f16 q8_0; do
      # A 5,700-token shared context: long prompts through the engine, and a prefix-cache hit of
      # the whole context in the warm phase, with the cold run's bytes.
      run "serve-invariance-5k7-$kv" 400 "$BIN/memra-verify" --kv-dtype "$kv" serve-invariance "$f" \
        --device cuda:0 --requests 8 --max-tokens 16 --context 5700
    done
    run ttft-cached-turn 200 "$BIN/memra-bench" ttft "$f" --device cuda:0 --prompt 5700 --turn 50 --gen 1 \
      --runs 5 --shape llama3-8b --dtype Q4_K_M --out "$OUT/long.jsonl"
    grep ttft "$LOG/ttft-cached-turn.log" | tee -a "$SUMMARY"
    # The same cached turn through memra-server (streaming, time to the first content delta).
    MEMRA_MODELS="m=$f" MEMRA_ADDR="127.0.0.1:18082" MEMRA_DEVICE=cuda:0 \
      "$BIN/memra-server" > "$LOG/server-long.log" 2>&1 &
    spid=$!
    for _ in $(seq 1 240); do
      curl -s -o /dev/null -w "%{http_code}" "127.0.0.1:18082/ready" 2>/dev/null | grep -q 200 && break
      sleep 0.5
    done
    run ttft-cached-turn-server 200 "$BIN/memra-bench" ttft "$f" --server 127.0.0.1:18082 --device cuda:0 --prompt 5700 \
      --turn 50 --gen 1 --runs 5 --shape llama3-8b --dtype Q4_K_M --out "$OUT/long.jsonl"
    grep ttft "$LOG/ttft-cached-turn-server.log" | tee -a "$SUMMARY"
    kill -TERM "$spid"; wait "$spid"
    for kv in f16 bf16 q8_0; do
      run "decode-depth-$kv" 300 "$BIN/memra-bench" decode "$f" --device cuda:0 --prompt 512 \
        --depth 8192,32768 --gen 128 --runs 3 --kv-dtype "$kv" --shape llama3-8b --dtype Q4_K_M \
        --out "$OUT/long.jsonl"
      grep decode "$LOG/decode-depth-$kv.log" | tee -a "$SUMMARY"
    done
  fi
fi

if has serve; then
  [ -e "$SMOL" ] && run serve-invariance-smollm2-n32 300 "$BIN/memra-verify" serve-invariance "$SMOL" \
    --device cuda:0 --requests 32 --max-tokens 32
  f=$(llama q4_k_m)
  if [ -e "$f" ]; then
    run concurrency-llama3-8b-q4_k_m 400 "$BIN/memra-bench" concurrency "$f" --device cuda:0 \
      --levels 1,8,32 --prompt-len 128 --gen 128
    grep concurrency "$LOG/concurrency-llama3-8b-q4_k_m.log" | tee -a "$SUMMARY"
  fi
fi

if has server; then
  # memra-server on the GPU + 64 concurrent streaming clients x 4 requests (memra-bench load).
  serve_load() {
    local name=$1 model=$2 port=$3
    [ -e "$model" ] || { row "server $name" "missing $model"; return; }
    MEMRA_MODELS="m=$model" MEMRA_ADDR="127.0.0.1:$port" MEMRA_DEVICE=cuda:0 MEMRA_MAX_QUEUE=512 \
      MEMRA_TENANT_MAX_IN_FLIGHT=128 MEMRA_MAX_IN_FLIGHT=128 MEMRA_MAX_RUNNING=64 \
      "$BIN/memra-server" > "$LOG/server-$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 240); do
      curl -s -o /dev/null -w "%{http_code}" "127.0.0.1:$port/ready" 2>/dev/null | grep -q 200 && break
      sleep 0.5
    done
    run "server-load-$name" 300 "$BIN/memra-bench" load --addr "127.0.0.1:$port" --model m \
      --clients 64 --requests 4 --max-tokens 64
    tail -n 1 "$LOG/server-load-$name.log" | tee -a "$SUMMARY"
    # The server's counters after the run (tokens, TTFT and inter-token latency sums).
    curl -s "127.0.0.1:$port/metrics" > "$LOG/metrics-$name.txt" 2>/dev/null
    grep -vE '^#|_bucket|requests_total' "$LOG/metrics-$name.txt" | head -n 20 | tee -a "$SUMMARY"
    kill -TERM "$pid"; wait "$pid"; row "server $name exit" "rc=$?"
  }
  serve_load smollm2 "$SMOL" 18080
  serve_load llama3-8b-q4_k_m "$(llama q4_k_m)" 18081
fi

if has speed; then
  IDS=$(python3 -c "print(','.join(str(100 + i * 7 % 40000) for i in range(512)))")
  # speed NAME MODEL [run-gen flags...]
  speed() {
    local name=$1 model=$2; shift 2
    [ -e "$model" ] || { row "tok/s $name" "missing $model"; return; }
    if timeout 240 "$BIN/run-gen" "$model" --device cuda:0 --json --prompt-ids "$IDS" \
        --max-tokens 128 --ignore-eos "$@" > "$LOG/speed-$name.json" 2> "$LOG/speed-$name.err"; then
      row "tok/s $name" "$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('prefill %.0f tok/s, decode %.1f tok/s (%d tokens, graphs %s) ids %08x' % (j['prompt_tok_per_s'], j['decode_tok_per_s'], len(j['tokens']), j.get('cuda_graphs'), hash(tuple(j['tokens'])) & 0xffffffff))" "$LOG/speed-$name.json")"
    else
      row "tok/s $name" "FAIL: $(tail -n 2 "$LOG/speed-$name.err" | tr '\n' ' ' | cut -c1-160)"
    fi
  }
  SAMPLED="--temperature 0.8 --top-k 40 --top-p 0.9 --seed 7"
  speed smollm2-q4_1 "$SMOL"
  speed smollm2-q4_1-nograph "$SMOL" --no-cuda-graph
  speed smollm2-q4_1-sampled "$SMOL" $SAMPLED
  speed smollm2-q4_1-sampled-nograph "$SMOL" $SAMPLED --no-cuda-graph
  speed gemma3-270m-q4_k_m "$GEMMA"
  speed gemma3-270m-q4_k_m-nograph "$GEMMA" --no-cuda-graph
  for d in $SYNTH; do speed "llama3-8b-$d" "$(llama "$d")"; done
  if case " $SYNTH " in *" q4_k_m "*) true;; *) false;; esac; then
    speed llama3-8b-q4_k_m-nograph "$(llama q4_k_m)" --no-cuda-graph
    speed llama3-8b-q4_k_m-sampled "$(llama q4_k_m)" $SAMPLED
    speed llama3-8b-q4_k_m-sampled-nograph "$(llama q4_k_m)" $SAMPLED --no-cuda-graph
  fi
fi

echo
echo "== memra device battery ($(date -u +%FT%TZ))"
cat "$SUMMARY"
# Everything but the summary goes back as one archive (the device tool returns at most 8 files).
tar czf "$OUT/battery-logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
