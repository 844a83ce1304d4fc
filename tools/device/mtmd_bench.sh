#!/usr/bin/env bash
# The vision side by side (issue 38): memra-bench vision, then llama.cpp's llama-mtmd-cli on the
# same text GGUF, mmproj and image files (PNG, written by memra-bench vision --images-dir), both
# into one rows file under one run id. docs/BENCH.md "vision".
#   tools/device/mtmd_bench.sh MODEL MMPROJ DIR
# DIR gets img-NNN.png (img-000 the warm-up), the llama.cpp logs (mtmd-NNN.log) and rows.jsonl
# (or $ROWS). Environment: RUN (the run id), MB (memra-bench, default .device/bin/memra-bench
# or PATH), LLAMA_MTMD (default $HOME/llama.cpp/build/bin/llama-mtmd-cli, tools/device/peer.sh
# build), DEVICE (cuda:0), SHAPE / DTYPE (the rows' labels, default gemma3-270m / Q4_K_M),
# IMAGES (timed encodes, 16), RUNS (timed one-image requests, 5), MTMD_TIMEOUT (s per image, 120),
# TEMPLATE (llama-mtmd-cli's --chat-template, default gemma: it refuses a GGUF without one, as the
# Gemma 3 270M file is, run h100-20261207-dwarp).
# llama.cpp runs once per image file (-n 1, -ngl 99, a fresh process each: no cache between
# them), max(IMAGES, RUNS) + 1 files; `memra-bench peer mtmd` reads its encode time (`mtmd
# batch encoding done in N ms`) and prompt eval (llama_perf_context_print) from each log.
# Exit status: memra's, else the peer's (a missing llama-mtmd-cli is status 3, memra's rows kept).
set -uo pipefail
[ $# -eq 3 ] || { sed -n 2,16p "$0" >&2; exit 2; }
MODEL=$1 MMPROJ=$2 DIR=$3
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MB=${MB:-}
[ -n "$MB" ] || { [ -x "$ROOT/.device/bin/memra-bench" ] && MB="$ROOT/.device/bin/memra-bench"; }
[ -n "$MB" ] || MB=$(command -v memra-bench || echo memra-bench)
LLAMA_MTMD=${LLAMA_MTMD:-$HOME/llama.cpp/build/bin/llama-mtmd-cli}
RUN=${RUN:-mtmd-$(date -u +%Y%m%dT%H%M%SZ)}
DEVICE=${DEVICE:-cuda:0} SHAPE=${SHAPE:-gemma3-270m} DTYPE=${DTYPE:-Q4_K_M}
IMAGES=${IMAGES:-16} RUNS=${RUNS:-5} TEMPLATE=${TEMPLATE:-gemma}
ROWS=${ROWS:-$DIR/rows.jsonl}
PROMPT="Describe this image in one sentence." # memra_bench::vision::PROMPT
mkdir -p "$DIR"
labels=(--shape "$SHAPE" --dtype "$DTYPE" --run "$RUN" --out "$ROWS")
"$MB" vision "$MODEL" --mmproj "$MMPROJ" --device "$DEVICE" --images "$IMAGES" --runs "$RUNS" \
  --images-dir "$DIR" "${labels[@]}" || exit $?
[ -x "$LLAMA_MTMD" ] || { echo "no $LLAMA_MTMD (tools/device/peer.sh build)" >&2; exit 3; }
n=$(( (IMAGES > RUNS ? IMAGES : RUNS) + 1 ))
logs=()
for i in $(seq 0 $((n - 1))); do
  img=$(printf '%s/img-%03d.png' "$DIR" "$i") log=$(printf '%s/mtmd-%03d.log' "$DIR" "$i")
  timeout "${MTMD_TIMEOUT:-120}" "$LLAMA_MTMD" -m "$MODEL" --mmproj "$MMPROJ" --image "$img" \
    -p "$PROMPT" --chat-template "$TEMPLATE" -n 1 -ngl 99 -fa on --temp 0 -c 4096 < /dev/null > "$log" 2>&1 ||
    { echo "llama-mtmd-cli failed on $img: $(tail -n 3 "$log")" >&2; exit 4; }
  logs+=("$log")
done
"$MB" peer mtmd "${logs[@]}" --model "$MODEL" --mmproj "$MMPROJ" --device "$DEVICE" "${labels[@]}"
