# Helpers of the lease queue (sourced by queue.sh and synth.sh; runs ON the GPU machine from
# $HOME/repo): paths, the step primitives (row, run, mb, waitf, peer, peerwait, pick) and the
# gate groups and measurements more than one step of queue.sh runs. Logs and the summary go to
# $HOME/q, NOT $OUT (the device tool empties $OUT at every call); poll.sh copies them into $OUT.
# docs/DEVICE.md step 3.
B=$HOME/dev/.device/bin
export MEMRA_KERNEL_CACHE=$HOME/.cache/memra/kernels MEMRA_COMMIT=$(cat $HOME/dev/.device/COMMIT 2>/dev/null)
M=$HOME/models
SMOL=$M/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$M/gemma-3-270m-q4_k_m.gguf
Q4=$M/q4.gguf      # llama3-8b Q4_K_M, 128k context (synth.sh)
MOE=$M/moe.gguf    # qwen3-30b-a3b Q4_K_M
Q3N=$M/q3n.gguf    # qwen3-next-80b-a3b Q4_K_M (~45 GB)
Q8=$M/q8.gguf F16=$M/f16.gguf
FP8=$M/fp8-hf NVFP4=$M/nvfp4-hf   # llama3-8b HF checkpoints (synth.sh fp8 / nvfp4)
Q3T=$M/q3n-tiny-q8.gguf Q3TF=$M/q3n-tiny-f32.gguf   # tiny random qwen3next files (tiny_q3n)
KV=$HOME/dev/.device/kvar   # staged products.cu variants (PACK_KVARS, tools/device/pack.sh)
O=$HOME/q; mkdir -p $O/logs; S=$O/summary.txt
LB=$HOME/llama.cpp/build/bin/llama-bench
LS=$HOME/llama.cpp/build/bin/llama-server
export B O
# row NAME TEXT: one line of the summary
row() { printf '%s %-26s %s\n' "$(date +%T)" "$1" "$2" >> $S; }
# run NAME TIMEOUT CMD...: a step with its log; the summary gets rc, seconds and the last line.
# A step named in $LEASE_SKIP (space-separated) is skipped: a queue restarted on a fresh machine
# (the last one was handed back) passes the steps an earlier machine finished.
run() { local n=$1 t=$2; shift 2; local t0=$SECONDS
  case " ${LEASE_SKIP:-} " in *" $n "*) row "$n" "skipped (LEASE_SKIP)"; return 0 ;; esac
  timeout $t "$@" > $O/logs/$n.log 2>&1; local rc=$?
  row "$n" "rc=$rc $((SECONDS-t0))s $(grep -v '^\s*$' $O/logs/$n.log | tail -n 1 | cut -c1-150)"; return $rc; }
# waitf FILE [SECONDS]: wait for a staged or synthesized file
waitf() { for i in $(seq 1 ${2:-400}); do [ -e "$1" ] && return 0; sleep 1; done; row "MISSING $1" ""; return 1; }
# peer NAME llama-bench-args...: one llama-bench run (-ngl 99 -fa 1 -r 3, JSONL into $O/peer.jsonl)
peer() { local n=$1; shift
  case " ${LEASE_SKIP:-} " in *" peer-$n "*) row "peer-$n" "skipped (LEASE_SKIP)"; return 0 ;; esac
  [ -x $LB ] || { row "peer-$n" "no llama-bench"; return; }
  local t0=$SECONDS; timeout 240 $LB "$@" -ngl 99 -fa 1 -r 3 -o jsonl >> $O/peer.jsonl 2>> $O/logs/peer-$n.err
  row "peer-$n" "rc=$? $((SECONDS-t0))s $(tail -n 1 $O/peer.jsonl | grep -oE '"avg_ts": [0-9.]+')"; }
# peerwait: until the background llama.cpp build has ended (once it has, later calls return at once)
peerwait() { [ -n "${PEER_BUILT:-}" ] && return 0
  for i in $(seq 1 400); do grep -q "build rc=" $HOME/llama-build.log 2>/dev/null && { PEER_BUILT=1; break; }; sleep 1; done
  row peer-build "$(tail -n 1 $HOME/llama-build.log 2>/dev/null)"; }
# mb NAME TIMEOUT ARGS...: `run` of memra-bench ARGS with the queue's run id ($RUN) and rows file
# appended: the default-configuration rows that go to reports/data/h200.jsonl.
mb() { local n=$1 t=$2; shift 2; run $n $t $B/memra-bench "$@" --run "$RUN" --out "$O/memra.jsonl" --quiet; }
# The issue-8 gates on SmolLM2 (golden, invariance, graph, tokens, serve-invariance of 32
# requests, n-gram speculation; after its pieces arrived). The llama3-8b ones are queue.sh's 8b.
gates_smol() {
  waitf $HOME/smol.ok 300 && {
    run golden 300 $B/memra-verify golden $SMOL --device cuda:0
    run inv-smol 200 $B/memra-verify invariance $SMOL --device cuda:0
    run graph-smol 200 $B/memra-verify graph $SMOL --device cuda:0
    run tokens-smol 200 $B/memra-verify tokens $SMOL --device cuda:0 --fixture verify/fixtures/smollm2-135m-reference.json
    run serve-inv-smol 300 $B/memra-verify serve-invariance $SMOL --device cuda:0 --requests 32
    # n-gram speculation on the real model, K = 1..6, greedy and seeded sampling, both paths:
    # byte-identical to plain decoding, and sampled K >= 2 steps must accept drafts (the device
    # picks of a verify step's later rows, one topk_rows launch, reach the output)
    run spec-smol 300 $B/memra-verify spec $SMOL --device cuda:0 --drafters ngram --k-max 6
  }
}
# pick k:DTYPE -> $k, $dt, $f (the model file), $sh (its shape label).
pick() { k=${1%%:*}; dt=${1##*:}
  case $k in q4) f=$Q4 sh=llama3-8b ;; q8) f=$Q8 sh=llama3-8b ;; f16) f=$F16 sh=llama3-8b ;;
    smol) f=$SMOL sh=smollm2-135m ;; moe) f=$MOE sh=qwen3-30b-a3b ;; gemma) f=$GEMMA sh=gemma3-270m ;;
    q3n) f=$Q3N sh=qwen3-next-80b-a3b ;; esac; }
# sbs k:DTYPE...: the side-by-side rows of each model (memra decode, llama.cpp tg128 at depth
# 512, memra prefill 512 / 4096 (the decode run's --prefill: one load), llama.cpp pp512 / pp4096, on the same file; after peerwait).
sbs() { for x in "$@"; do
  pick $x; waitf $f 60 || continue
  # decode and prefill rows from one load (a 48 GB file loads in minutes), then llama.cpp's
  mb $k-decode 540 decode $f --device cuda:0 --prompt 512 --gen 128 --prefill 512,4096 --runs 3 --shape $sh --dtype $dt
  peer $k-tg -m $f -p 0 -n 128 -d 512
  peer $k-pp -m $f -p 512,4096 -n 0
done; }
# load_row: TTFT and the 64-client load row through memra-server and llama-server (Q4_K_M).
load_row() {
  ln -sf $Q4 $M/synth-llama3-8b-q4_k_m.gguf
  run load 420 env OUT=$O/sbs RUN=$RUN SBS_STEPS=load MEMRA_BIN=$B tools/device/sidebyside.sh
  grep -h "streaming" $O/sbs/sidebyside.md >> $S 2>/dev/null
}
# The tiny random MoE and Gemma 3 models (no file needed): routing and expert products, windowed
# attention and GeGLU.
gates_tiny() {
  for t in qwen3moe gemma3 qwen3next; do
    run inv-tiny-$t 240 $B/memra-verify invariance --tiny $t --device cuda:0
    run graph-tiny-$t 240 $B/memra-verify graph --tiny $t --device cuda:0
  done
  # speculation as memra-server runs it by default (auto: MTP + n-gram picked per sequence) and
  # the per-step pick, byte-identical to plain decoding
  run spec-tiny-auto 300 $B/memra-verify spec --device cuda:0 --tiny llama+mtp-oracle --drafters auto,pick --max-tokens 24
  run spec-tiny-q3n 300 $B/memra-verify spec --device cuda:0 --tiny qwen3next+mtp --drafters auto,mtp --k-max 4 --max-tokens 16
}
# spec_rows k:DTYPE...: memra-bench spec (bench/workloads/spec.jsonl) through one memra-server
# serving each file twice (on = the default speculation, off = +spec=off), greedy and sampled,
# one client alternating the modes, then 64 clients per mode (the workload sent 6 times: 72 requests a mode, so all 64 are busy); rows into $O/spec.jsonl (their
# own schema: reports/spec/), tables into $O/spec-K.md. Fails on any output that differs.
# SPEC_K=N: the on model drafts up to N per step (+spec_k=N; default spec::DEFAULT_K, 8).
spec_rows() { for x in "$@"; do
  pick $x; waitf $f 300 || continue
  MEMRA_MODELS="on=$f${SPEC_K:++spec_k=$SPEC_K},off=$f+spec=off" MEMRA_KV_BLOCKS=${SPEC_KV_BLOCKS:-4096} MEMRA_ADDR=127.0.0.1:8091 \
    $B/memra-server > $O/logs/spec-server-$k.log 2>&1 &
  local pid=$!
  for i in $(seq 1 240); do curl -s -o /dev/null -w "%{http_code}" 127.0.0.1:8091/ready 2>/dev/null | grep -q 200 && break; sleep 0.5; done
  local sb="$B/memra-bench spec --addr 127.0.0.1:8091 --model-file $f --shape $sh --dtype $dt --device cuda:0 --run $RUN --out $O/spec.jsonl"
  run spec-$k 300 $sb --repeat 2 --table $O/spec-$k.md
  run spec-load-$k 400 $sb --clients 64 --repeat 6 --max-tokens 128 --table $O/spec-load-$k.md
  grep -E "grounded|all" $O/spec-$k.md $O/spec-load-$k.md 2>/dev/null | cut -c1-200 >> $S
  kill $pid; wait $pid 2>/dev/null
done; }
# spec_peer k:DTYPE...: the spec_rows workload through llama-server (after peerwait): its own
# n-gram speculation on :8092 ($LLAMA_SPEC; default ngram-simple, a 4-token match drafting the 4
# that followed it, as memra's K = 4: for ngram-simple the draft length is --spec-ngram-simple-
# size-m, --spec-draft-n-max does not reach it) and plain on :8093, through memra-bench spec's
# client (one client, the modes alternating, greedy and sampled, the same seeds as spec_rows).
# Rows into $O/spec-peer.jsonl (engine llama.cpp), tables into $O/spec-peer-K.md. The issue's
# "vs llama-server" ratio: memra's on tok/s (spec-K.md) over llama's on tok/s (spec-peer-K.md),
# row by row. llama.cpp's outputs with and without its speculation need not be the same bytes:
# the step's rc says whether they were; the rows are written either way.
spec_peer() { [ -x $LS ] || { row spec-peer "no $LS (tools/device/peer.sh build)"; return; }
  for x in "$@"; do
  pick $x; waitf $f 300 || continue
  local on=(--port 8092 ${LLAMA_SPEC:---spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 4 --spec-draft-n-max 4})
  $LS -m $f -ngl 99 -fa on -c 16384 --metrics "${on[@]}" > $O/logs/spec-peer-on-$k.log 2>&1 &
  local p1=$!
  $LS -m $f -ngl 99 -fa on -c 16384 --metrics --port 8093 > $O/logs/spec-peer-off-$k.log 2>&1 &
  local p2=$!
  for port in 8092 8093; do
    for i in $(seq 1 240); do curl -s -o /dev/null -w "%{http_code}" 127.0.0.1:$port/health 2>/dev/null | grep -q 200 && break; sleep 0.5; done
  done
  run spec-peer-$k 400 $B/memra-bench spec --addr 127.0.0.1:8092 --addr-off 127.0.0.1:8093 --engine llama.cpp \
    --model-file $f --shape $sh --dtype $dt --device cuda:0 --run $RUN --out $O/spec-peer.jsonl --repeat 2 --table $O/spec-peer-$k.md
  grep -E "grounded|all" $O/spec-peer-$k.md 2>/dev/null | cut -c1-200 >> $S
  kill $p1 $p2; wait $p1 $p2 2>/dev/null
done; }
# gates_gemma: the real Gemma 3 270M (pieces NAME gemma): invariance, graph, tokens against the
# reference fixture, serve-invariance (the kernels gate is queue.sh's step kgate).
gates_gemma() {
  waitf $HOME/gemma.ok 300 && {
    run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0
    run graph-gemma 300 $B/memra-verify graph $GEMMA --device cuda:0
    run tokens-gemma 300 $B/memra-verify tokens $GEMMA --device cuda:0 --fixture verify/fixtures/gemma3-270m-reference.json
    run serve-inv-gemma 300 $B/memra-verify serve-invariance $GEMMA --device cuda:0 --requests 32
  }
}
# ktimes k:DTYPE...: per-kernel GPU times of decode with CUDA graphs (nsys, graph nodes traced),
# 64 tokens on each file; the kernel summary into $O/kern-K.csv and its top lines in the summary.
ktimes() {
  local ns=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  [ -n "$ns" ] || { row ktimes "no nsys on this machine"; return; }
  for x in "$@"; do pick $x; waitf $f 300 || continue
    run nsys-$k 300 $ns profile -o $O/nsys-$k --force-overwrite true --cuda-graph-trace=node $B/run-gen $f --device cuda:0 --prompt "The capital of France is a city that" --max-tokens 64
    $ns stats -q -r cuda_gpu_kern_sum -f csv -o $O/kern-$k $O/nsys-$k.nsys-rep > /dev/null 2>&1
    head -14 $O/kern-$k*.csv | cut -c1-160 >> $S; rm -f $O/nsys-$k.nsys-rep $O/nsys-$k.sqlite
  done
}
# kern k:DTYPE:SKIP:COUNT...: per-kernel device times of plain decode steps under ncu (no nsys on
# the H100 machines): COUNT launches after the first SKIP (past the load and the prefill), their
# names and gpu__time_duration into $O/ncu-K.csv (DRAM bytes read in the log), a per-name sum into
# the summary. KERN_CLOCK=none: the GPU's own clocks (ncu's default locks base clocks); caches are
# flushed between kernels either way, as a decode step's weights are (llama3-8b: q4:Q4_K_M:1200:300
# is ~28 layers and the head, reports/kernel-notes.md). KERN_PROMPT=N: a prefill of N tokens
# instead (ids 1000.., one token generated), its files ncu-K-ppN.
kern() {
  local nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$nc" ] || { row kern "no ncu on this machine"; return; }
  for x in "$@"; do
    local skip=$(echo $x | cut -d: -f3) count=$(echo $x | cut -d: -f4)
    pick ${x%%:*}:$(echo $x | cut -d: -f2); waitf $f 300 || continue
    local t=$k${KERN_PROMPT:+-pp$KERN_PROMPT} input=(--prompt "The capital of France is a city that" --max-tokens 16)
    [ -n "${KERN_PROMPT:-}" ] && input=(--prompt-ids $(seq -s, 1000 $((999 + KERN_PROMPT))) --max-tokens 1)
    run ncu-$t 300 $nc --clock-control ${KERN_CLOCK:-base} --launch-skip $skip --launch-count $count \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      $B/run-gen $f --device cuda:0 "${input[@]}" --no-cuda-graph
    grep '"gpu__time_duration.sum"' $O/logs/ncu-$t.log > $O/ncu-$t.csv
    python3 - $O/ncu-$t.csv >> $S <<'PY'
import csv, sys, collections
t = collections.defaultdict(lambda: [0, 0.0])
for r in csv.reader(open(sys.argv[1])):
    if len(r) > 4:
        name = r[4].split('(')[0]; v = float(r[-1].replace(',', '')); unit = r[-2]
        v = v / 1000 if unit in ('ns', 'nsecond') else v
        t[name][0] += 1; t[name][1] += v
for n, (c, us) in sorted(t.items(), key=lambda kv: -kv[1][1])[:14]:
    print(f"  {n[:40]:40s} {c:5d} launches {us:9.1f} us")
PY
  done
}
# kdet k:DTYPE:SKIP:COUNT:REGEX...: ncu's detailed sections (speed of light, launch, occupancy,
# warp states, scheduler) of COUNT launches of the kernels matching REGEX after SKIP of them, at
# the GPU's own clocks and warm caches (--clock-control none --cache-control none: the times a
# graph step sees, not base clocks after a flush); the details page into the log, the duration
# and the top warp stall reasons into the summary.
kdet() {
  local nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$nc" ] || { row kdet "no ncu on this machine"; return; }
  for x in "$@"; do
    local skip=$(echo $x | cut -d: -f3) count=$(echo $x | cut -d: -f4) re=$(echo $x | cut -d: -f5)
    pick ${x%%:*}:$(echo $x | cut -d: -f2); waitf $f 300 || continue
    run kdet-$k-$re 300 $nc -k "regex:$re" --launch-skip $skip --launch-count $count --clock-control none \
      --cache-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      $B/run-gen $f --device cuda:0 --prompt "The capital of France is a city that" --max-tokens 24 --no-cuda-graph
    grep -E "^  [a-z_0-9]+ \(|Duration|Elapsed Cycles|SM Active Cycles|Warp Cycles Per Issued|Issued Warp|Achieved Occupancy" \
      $O/logs/kdet-$k-$re.log | head -30 | cut -c1-150 >> $S
    # the stall reasons above 0.05 warps per issued instruction, largest first
    grep -E "issue_stalled_" $O/logs/kdet-$k-$re.log | awk '$NF+0 > 0.05 {print "    " $1, $NF}' | sort -k2 -nr | head -24 >> $S
  done
}
# ksel k:DTYPE...: device times of the token-selection kernels (ncu) in sampled decoding
# (t 0.8, top-p 0.9, top-k 40, seed 1), plainly and with n-gram speculation (K = 4): topk_rows
# launches of 1 row (plain) and of K + 1 rows (verify steps), against one row's topk_row time
# before the batching (~0.2 ms SmolLM2, ~0.8 ms Gemma 3, inferred from plain sampled minus
# greedy step time). Per kernel name: launches and mean us into the summary.
ksel() {
  local nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ -n "$nc" ] || { row ksel "no ncu on this machine"; return; }
  local p="Shopping list: apples, bread, carrots, eggs, milk, rice, tomatoes. The shopping list again, in the same order: apples,"
  for x in "$@"; do pick $x; waitf $f 300 || continue
    for mode in plain spec; do
      local sp=""; [ $mode = spec ] && sp="--spec ngram --spec-k 4"
      run ksel-$k-$mode 300 $nc -k "regex:topk_row|argmax_" --launch-count 60 --metrics gpu__time_duration.sum --csv \
        $B/run-gen $f --device cuda:0 --prompt "$p" --max-tokens 64 --no-cuda-graph --temperature 0.8 --top-p 0.9 --top-k 40 --seed 1 $sp
      grep '"gpu__time_duration.sum"' $O/logs/ksel-$k-$mode.log | python3 -c '
import csv, sys, collections
t = collections.defaultdict(lambda: [0, 0.0])
for r in csv.reader(sys.stdin):
    if len(r) > 4:
        v = float(r[-1].replace(",", "")); v = v / 1000 if r[-2] in ("ns", "nsecond") else v
        t[r[4].split("(")[0]][0] += 1; t[r[4].split("(")[0]][1] += v
for n, (c, us) in t.items(): print(f"  '$k-$mode' {n:12s} {c:4d} launches, mean {us / c:8.1f} us")' >> $S
    done
  done
}
# prof k:DTYPE...: the per-op device times of plain decode steps (no graphs) on each file.
prof() { for x in "$@"; do
  pick $x; waitf $f 300 || continue
  MEMRA_PROFILE_OPS=1 run prof-$k 200 $B/run-gen $f --device cuda:0 --prompt "The capital of France is a city that" --max-tokens 48 --no-cuda-graph
  grep -A16 "op profile" $O/logs/prof-$k.log >> $S
done; }
# Pipeline stages (issue 41): the model split in two vs unsplit, both stages on cuda:0 (a
# device-to-device hand-over), `PP_DEVICES=cuda:0,cuda:1` for two GPUs (the peer copy): the pp
# gate on tiny llama / gemma3 / qwen3next / qwen3moe and on SmolLM2 (every spread boundary),
# then invariance, graph and serve-invariance with --pp 2 on SmolLM2.
gates_pp() {
  local d=${PP_DEVICES:-cuda:0,cuda:0}
  row pp "both stages on $d"
  for t in llama gemma3 qwen3next qwen3moe; do
    run pp-tiny-$t 240 $B/memra-verify pp --tiny $t --device cuda:0 --devices $d --max-m 64
  done
  waitf $HOME/smol.ok 300 && {
    run pp-smol 300 $B/memra-verify pp $SMOL --device cuda:0 --devices $d --max-m 64
    run inv-smol-pp2 240 $B/memra-verify invariance $SMOL --device cuda:0 --pp 2 --devices $d
    run graph-smol-pp2 240 $B/memra-verify graph $SMOL --device cuda:0 --pp 2 --devices $d
    run serve-inv-smol-pp2 300 $B/memra-verify serve-invariance $SMOL --device cuda:0 --pp 2 --devices $d --requests 32
  }
}
# Long context on the 128k-context llama3-8b Q4_K_M (synth.sh q4): invariance at an 8,192-token
# prompt per KV format, serve-invariance over a 5,700-token shared context (f16, q8_0), the
# cached-turn TTFT (5,700 + 50 tokens) and decode at depth 8,192 / 32,768 per format (rows).
long_ctx() {
  waitf $Q4 || return
  for kv in f16 bf16 q8_0; do
    run inv-8k-$kv 300 $B/memra-verify --kv-dtype $kv invariance $Q4 --device cuda:0 --prompt-len 8192 --max-m 8
  done
  for kv in f16 q8_0; do
    run serve-inv-5k7-$kv 400 $B/memra-verify --kv-dtype $kv serve-invariance $Q4 --device cuda:0 --requests 8 --max-tokens 16 --context 5700
  done
  mb ttft-turn 200 ttft $Q4 --device cuda:0 --prompt 5700 --turn 50 --gen 1 --runs 5 --shape llama3-8b --dtype Q4_K_M
  for kv in f16 bf16 q8_0; do
    mb decode-depth-$kv 300 decode $Q4 --device cuda:0 --prompt 512 --depth 8192,32768 --gen 128 --runs 3 --kv-dtype $kv --shape llama3-8b --dtype Q4_K_M
  done
}
# tiny_q3n: the tiny random qwen3next files (q8_0 $Q3T, f32 $Q3TF) with SmolLM2's tokenizer.
tiny_q3n() {
  [ -e $Q3T ] || $B/memra-bench synth --shape tiny-qwen3next --dtype q8_0 --tokenizer-from $M/tok.gguf --out $Q3T --quiet
  [ -e $Q3TF ] || $B/memra-bench synth --shape tiny-qwen3next --dtype f32 --tokenizer-from $M/tok.gguf --out $Q3TF --quiet
}
# fp8_tiny T...: invariance and graph on tiny FP8 / NVFP4 models (--tiny llama+fp8, qwen3+nvfp4, ...).
fp8_tiny() { for t in "$@"; do
  run inv-$t 200 $B/memra-verify invariance --device cuda:0 --tiny $t
  run graph-$t 200 $B/memra-verify graph --device cuda:0 --tiny $t
done; }
# vs KEY FILE SHAPE: with DECODE_VS=<another build's memra-bench> (copied to the device outside
# the repo copy, e.g. `gunzip -c .stage/mb-vs.gz > $HOME/mb-vs; DECODE_VS=$HOME/mb-vs ...`), its
# decode row against this build's on FILE (Q4_K_M), alternated VS_ROUNDS times (default 2; each
# run loads the file: ~70 s for qwen3-30b-a3b, ~3 min for the 80B) into vs.jsonl (run ids
# $RUN-vs and $RUN-this); nothing without it.
vs() {
  [ -n "${DECODE_VS:-}" ] || return 0
  for i in $(seq ${VS_ROUNDS:-2}); do
    for who in vs this; do
      bin=$B/memra-bench; [ $who = vs ] && bin=$DECODE_VS
      run $1-$who-decode$i 200 $bin decode $2 --device cuda:0 --prompt 512 --gen 128 --runs 1 --shape $3 --dtype q4_k_m --run $RUN-$who --out $O/vs.jsonl --quiet
    done
  done
}
