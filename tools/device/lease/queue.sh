#!/usr/bin/env bash
# queue.sh: the lease queue (docs/DEVICE.md step 3). Runs ON the GPU machine, started by start.sh,
# the words of $STEPS in the order given; it logs to $HOME/q (poll.sh copies it into $OUT) and
# ends with `touch $HOME/queue.done`, whatever happens.
#   STEPS="close" LEASE_SYNTH="q4 q8 f16" LEASE_RUN=h200-YYYYMMDD-NAME bash tools/device/lease/start.sh
# A word is a preset, a step, or a step with its models: `sbs=moe:Q4_K_M,gemma:Q4_K_M` (steps
# marked [=] take a list of k:DTYPE, k one of q4 q8 f16 smol moe gemma q3n; without it, the
# variable named, else the default). `bash tools/device/lease/queue.sh --check` prints what STEPS
# expands to, or the words it does not know (start.sh runs it before it starts anything).
#
# Presets (one word for each queue script this one replaced):
#   close   gates sbs load                    (LEASE_SYNTH="q4 q8 f16", pieces smol; ~8 device-min)
#   next    gates-next kvar sbs load sbs=moe:Q4_K_M,gemma:Q4_K_M kvar-e2e f16-ops
#                                             (LEASE_SYNTH="q4 q8 f16 moe", pieces smol and gemma; ~25)
#   regate  gates-regate memra=gemma:Q4_K_M,moe:Q4_K_M   (LEASE_SYNTH="fp8 moe", pieces smol and gemma; ~6)
#   hybrid  delta serve peer kgate sbs=q3n:Q4_K_M inv80  (LEASE_SYNTH=q3n)
#   fp8     fp8tiny fp8hf fp8rows             (LEASE_SYNTH="fp8 nvfp4 f16", no pieces; ~6)
#   (the pipeline queue is the step pp: STEPS=pp, LEASE_SYNTH=none, pieces smol; ~3)
#
# Gates (correctness; they may share the GPU):
#   gates        smol and 8b at once, then tiny (close's gates)
#   gates-next   smol then 8b, beside Gemma 3's invariance (prompt 700) and serve-invariance and
#                qwen3-30b-a3b's graph; then tiny (next's gates)
#   gates-regate three lanes at once: smol gemma | kgate ksplit tiny pp | fp8q vision-smol vg3
#                (REGATE_PP=0 / REGATE_FP8=0 leave pp / fp8q out)
#   kgate        the whole `memra-verify kernels` (log kernels)
#   ksplit       its attention group on the CUDA-core split kernel (--attn-split)
#   8b           kgate, ksplit, q4inv, F16 invariance (prompt 700, M to 8)
#   q4inv        invariance and graph on llama3-8b Q4_K_M
#   smol         golden, invariance, graph, tokens, serve-invariance (32 requests), n-gram spec
#                on SmolLM2 (lib.sh gates_smol; pieces smol)
#   smol-quick   golden, invariance, serve-invariance on SmolLM2
#   tiny         invariance and graph on tiny qwen3moe / gemma3 / qwen3next, default speculation
#                (lib.sh gates_tiny; no file needed)
#   gemma        invariance, graph, tokens, serve-invariance on the real Gemma 3 270M (pieces gemma)
#   gemma-quick  invariance and tokens on Gemma 3 270M
#   pp           pipeline stages (issue 41, lib.sh gates_pp): `memra-verify pp` on tiny llama /
#                gemma3 / qwen3next / qwen3moe and SmolLM2, invariance / graph / serve-invariance
#                with --pp 2 on SmolLM2; both stages on cuda:0 unless PP_DEVICES=cuda:0,cuda:1
#   delta        the kernels gate's GATE_GROUPS (default delta,rope,elementwise,matmul,moe,fused),
#                invariance, graph, spec on a tiny qwen3next (issue 34)
#   serve        serve-invariance on a tiny qwen3next file (prefix hits from state snapshots)
#   mtp          spec with qwen3next's MTP module, random and oracle-wired
#   peer         llama.cpp's logits (.stage/peer16.* from tools/peer/logits.py, carried) vs memra's
#   vision       the vision kernels, the Qwen ViT's CUDA tower feeding tiny M-RoPE models (and
#                its video path), serve-invariance with image requests, vision-smol, 225-row
#                images of a tiny tower (issue 38; runs while llama.cpp builds)
#   vision-smol  `memra-verify vision --reference f64` on SmolLM2: the CUDA tower vs the CPU's
#                and the float64 reference
#   vg3          a real-size random F16 Gemma 3 tower served by Gemma 3 270M (pieces gemma)
#   fp8q         invariance / graph on tiny llama+fp8, qwen3+nvfp4; run-gen and invariance (M to
#                8) on the llama3-8b FP8 folder (LEASE_SYNTH fp8)
#   fp8tiny      invariance / graph on tiny llama+fp8, qwen3+nvfp4, llama+nvfp4 (issue 37)
#   fp8hf        run-gen, invariance (M to 16), serve-invariance (16) on the FP8 and NVFP4 folders
#   inv80        invariance on qwen3-next-80b-a3b (LEASE_SYNTH q3n)
#
# Rows and profiles (measurements; alone on the GPU, after the gates):
#   sbs [=]      decode and pp512 / pp4096, memra and llama.cpp (llama-bench) on the same files,
#                after the llama.cpp build (SBS_MODELS, default q4 q8 f16 smol)
#   load         TTFT and the 64-client load row through memra-server and llama-server (Q4_K_M)
#   memra [=]    memra's decode rows alone, no llama.cpp (SBS_MODELS, default q4 smol): compare
#                with the last run's, not same-run ratios
#   spec [=]     memra-bench spec through memra-server, speculation on vs off (SPEC_MODELS,
#                default smol gemma q4; SPEC_K)
#   specpeer [=] the same workload through llama-server, its n-gram speculation on vs off
#                (LLAMA_SPEC; SPEC_MODELS): the "vs llama-server" ratio
#   long         long context on the 128k Q4_K_M (lib.sh long_ctx)
#   kbench       `memra-bench kernels` (KB_DTYPES, KB_SHAPES, KB_M)
#   kvar         every staged products.cu variant (PACK_KVARS) A/B in `memra-bench kernels`
#   kvar-e2e     the variants end to end on Q4_K_M, F16 (SmolLM2 with a variant named e; log only)
#   f16-ops      the op profile of a 2,000-token F16 prefill
#   fp8rows      decode and pp512 rows of FP8, NVFP4 and F16 (LEASE_SYNTH="fp8 nvfp4 f16")
#   ab [=]       an A/B of one switch on memra decode: AB_VAR, AB_VALUES (default "0 1"),
#                AB_MODELS (default smol gemma); into ab.jsonl
#   decode80     memra decode on qwen3-next-80b-a3b, DECODE_VS's alternation (VS_ROUNDS), its
#                op profile
#   pprof        its 512-token prefill's op profile, decode and prefill kernels under ncu
#                (PPROF_KERN, PPROF_PKERN, PPROF_KDET)
#   moe30        qwen3-30b-a3b in q3n.gguf's place: sbs, DECODE_VS, invariance, prefill kernels
#   mtp80        MTP speculation vs plain on the 80B oracle-wired twin (memra-bench spec)
#   mtmd         the vision side by side with llama-mtmd-cli (tools/device/mtmd_bench.sh; pieces
#                gemma, llama.tgz): both engines' rows into mtmd.jsonl
#   kt [=]       per-kernel decode times under nsys (PROF_MODELS, default gemma moe)
#   kern [=]     per-kernel decode times under ncu (KERN_MODELS, k:DTYPE:SKIP:COUNT; KERN_CLOCK)
#   kdet [=]     ncu's detailed sections of chosen kernels (KDET, k:DTYPE:SKIP:COUNT:REGEX)
#   ksel [=]     the token-selection kernels' times in sampled decoding (KSEL_MODELS)
#   prof [=]     the per-op decode profile (PROF_MODELS, default gemma moe)
# moe30 and mtp80 delete q3n.gguf (the disk holds one 48 GB file): put them after the steps that
# read it. All qwen3next steps, in their old order: delta serve mtp peer smol-quick kgate smol
# gemma-quick vision ab sbs=q3n:Q4_K_M decode80 pprof inv80 moe30 mtp80 vg3 mtmd.
# Other knobs: LEASE_RUN (the run id, default h200-YYYYMMDD-FIRSTWORD), LEASE_SKIP (lib.sh run).
set -u
cd $HOME/repo || exit 1; . tools/device/lease/lib.sh

preset() { case $1 in
  close)  echo gates sbs load ;;
  next)   echo gates-next kvar sbs load sbs=moe:Q4_K_M,gemma:Q4_K_M kvar-e2e f16-ops ;;
  regate) echo gates-regate memra=gemma:Q4_K_M,moe:Q4_K_M ;;
  hybrid) echo delta serve peer kgate sbs=q3n:Q4_K_M inv80 ;;
  fp8)    echo fp8tiny fp8hf fp8rows ;;
  *)      echo "$1" ;;
esac; }
# step WORD: the function s_NAME of a word NAME or NAME=MODEL,... (hyphens become underscores)
fn() { local n=${1%%=*}; echo s_${n//-/_}; }
step() { local a=; [[ $1 == *=* ]] && a=${1#*=}; $(fn $1) ${a//,/ }; }

# --- gates ---
s_gates() { s_smol & s_8b & wait; s_tiny; row gates-done ""; }
s_gates_next() {
  { s_smol; s_8b; } &
  { waitf $HOME/gemma.ok 400 && {
      run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0 --prompt-len 700
      run serve-inv-gemma 300 $B/memra-verify serve-invariance $GEMMA --device cuda:0; }
    waitf $MOE 400 && run graph-moe 300 $B/memra-verify graph $MOE --device cuda:0; } &
  wait; s_tiny; row gates-done ""
}
s_gates_regate() {
  { s_smol; s_gemma; } &
  { s_kgate; s_ksplit; s_tiny; [ "${REGATE_PP:-1}" = 0 ] || s_pp; } &
  { [ "${REGATE_FP8:-1}" = 0 ] || s_fp8q; s_vision_smol; s_vg3; } &
  wait
}
s_kgate() { run kernels 600 $B/memra-verify kernels --device cuda:0; grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -8 >> $S; }
# the attention group on the CUDA-core split kernel for every launch (the kernel the shapes
# without a tensor-core kernel take)
s_ksplit() { run kernels-attn-split 300 $B/memra-verify kernels --device cuda:0 --only attention --attn-split; }
s_8b() { s_kgate; s_ksplit; s_q4inv; waitf $F16 && run inv-f16 420 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 8; }
s_q4inv() { waitf $Q4 && run inv-q4 420 $B/memra-verify invariance $Q4 --device cuda:0 && run graph-q4 300 $B/memra-verify graph $Q4 --device cuda:0; }
s_smol() { gates_smol; }
s_smol_quick() {
  waitf $HOME/smol.ok 200 || return
  run golden 300 $B/memra-verify golden $SMOL --device cuda:0
  run inv-smol 200 $B/memra-verify invariance $SMOL --device cuda:0
  run serve-inv-smol 300 $B/memra-verify serve-invariance $SMOL --device cuda:0 --requests 32
}
s_tiny() { gates_tiny; }
s_gemma() { gates_gemma; }
s_gemma_quick() {
  waitf $HOME/gemma.ok 300 || return
  run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0
  run tokens-gemma 300 $B/memra-verify tokens $GEMMA --device cuda:0 --fixture verify/fixtures/gemma3-270m-reference.json
}
s_pp() { gates_pp; }
s_delta() {
  run kernels-delta 300 $B/memra-verify kernels --device cuda:0 --only ${GATE_GROUPS:-delta,rope,elementwise,matmul,moe,fused}
  grep -E "FAIL|delta|sigmoid|moe_norm_route" $O/logs/kernels-delta.log | head -12 >> $S
  run inv-tiny 300 $B/memra-verify invariance --device cuda:0 --tiny qwen3next
  run graph-tiny 300 $B/memra-verify graph --device cuda:0 --tiny qwen3next
  run spec-tiny 400 $B/memra-verify spec --device cuda:0 --tiny qwen3next --max-tokens 24 --k-max 4 --drafters ngram,self
}
s_serve() { tiny_q3n; run serve-tiny 400 $B/memra-verify serve-invariance $Q3T --device cuda:0 --requests 16 --context 40; }
s_mtp() {
  run mtp-tiny 300 $B/memra-verify spec --device cuda:0 --tiny qwen3next+mtp --drafters mtp --k-max 4 --max-tokens 16
  run mtp-oracle 300 $B/memra-verify spec --device cuda:0 --tiny qwen3next+mtp-oracle --drafters mtp --k-max 4 --max-tokens 16
}
s_peer() { waitf .stage/peer16.json 120 && { tiny_q3n; run peer-tiny 120 $B/memra-verify peer-logits $Q3TF --peer .stage/peer16.json --device cuda:0; }; }
s_vision() {
  run kernels-vision 300 $B/memra-verify kernels --device cuda:0 --only vision
  # The Qwen ViT's CUDA tower (against its CPU tower) feeding M-RoPE text models on CUDA
  # (rope_*_mrope, deepstack rows): tiny random text models with SmolLM2's tokenizer (tok.gguf:
  # no pieces needed). With --reference none the video too: the CUDA tower's video path against
  # the CPU tower's (2e-3), a second encoding bit-identical, greedy tokens of a video prompt fed
  # either rows equal (and, informative, a CPU engine's)
  for fam in qwen2vl qwen25vl qwen3vl; do
    MEMRA_TEST_MODEL=$M/tok.gguf run vision-$fam 300 $B/memra-verify vision --family $fam --device cuda:0 --reference none --images 3 --prompts 4
  done
  # serve-invariance with image requests (one in three; the CUDA tower's rows) on tiny text
  # model files: staggered load, preemption, prefix hits over the image, speculation, sampled
  # and constrained requests, byte-identical to alone (TEXT:TOWER: synth / synth-mmproj shapes)
  for p in gemma3:tiny qwen2vl:tiny-qwen25vl qwen3vl:tiny-qwen3vl; do tx=${p%%:*} mm=${p#*:}
    $B/memra-bench synth --shape tiny-$tx --dtype q8_0 --tokenizer-from $M/tok.gguf --out $M/vl-$tx.gguf --quiet &&
      run mm-$mm 60 $B/memra-bench synth-mmproj --shape $mm --text-hidden 64 --out $M/mm-$mm.gguf &&
      run serve-img-$tx 300 $B/memra-verify serve-invariance $M/vl-$tx.gguf --mmproj $M/mm-$mm.gguf --device cuda:0 --requests 16
  done
  s_vision_smol
  # 225-row images (near the real tower's 256) from a cheap tower: serving, prefix hits under load
  run mmproj-long 60 $B/memra-bench synth-mmproj --shape tiny-long --text-hidden 64 --out $M/mm-long.gguf &&
    MEMRA_TEST_MODEL=$SMOL run vision-long 300 $B/memra-verify vision --mmproj $M/mm-long.gguf --device cuda:0 --reference none --images 1 --prompts 4
}
s_vision_smol() { waitf $HOME/smol.ok 300 && MEMRA_TEST_MODEL=$SMOL run vision 200 $B/memra-verify vision --device cuda:0 --reference f64; }
# The CUDA tower at Gemma 3's real size (a random F16 tower, 4096 patches) against the CPU
# tower, its rows served by Gemma 3 270M (docs/VERIFY.md "The CUDA tower").
s_vg3() {
  run mmproj-g3 180 $B/memra-bench synth-mmproj --shape gemma3 --text-hidden 640 --dtype f16 --out $M/mm-g3.gguf &&
    waitf $HOME/gemma.ok 400 && run vision-g3 600 $B/memra-verify vision $GEMMA --mmproj $M/mm-g3.gguf --device cuda:0 --reference none --images 2 --prompts 4
}
s_fp8q() {
  fp8_tiny llama+fp8 qwen3+nvfp4
  waitf $FP8 400 || return
  run gen-fp8 300 $B/run-gen $FP8 --device cuda:0 --prompt "The capital of France is" --max-tokens 16
  run inv-fp8 420 $B/memra-verify invariance $FP8 --device cuda:0 --max-m 8
}
s_fp8tiny() { fp8_tiny llama+fp8 qwen3+nvfp4 llama+nvfp4; }
s_fp8hf() { for f in $FP8 $NVFP4; do
  local n; n=$(basename $f)
  waitf $f 600 || continue
  run gen-$n 300 $B/run-gen $f --device cuda:0 --prompt "The capital of France is" --max-tokens 16
  run inv-$n 420 $B/memra-verify invariance $f --device cuda:0 --max-m 16
  run serve-inv-$n 300 $B/memra-verify serve-invariance $f --device cuda:0 --requests 16
done; }
s_inv80() { waitf $Q3N 60 && run inv-q3n 420 $B/memra-verify invariance $Q3N --device cuda:0 --max-m 8 --prompt-len 80; }

# --- rows and profiles ---
s_sbs() { peerwait; sbs ${*:-${SBS_MODELS:-q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1}}; }
s_load() { peerwait; load_row; }
s_memra() { for x in ${*:-${SBS_MODELS:-q4:Q4_K_M smol:Q4_1}}; do
  pick $x; waitf $f 400 && mb $k-decode 300 decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
done; }
s_spec() { spec_rows ${*:-${SPEC_MODELS:-smol:Q4_1 gemma:Q4_K_M q4:Q4_K_M}}; }
s_specpeer() { peerwait; spec_peer ${*:-${SPEC_MODELS:-smol:Q4_1 gemma:Q4_K_M q4:Q4_K_M}}; }
s_long() { long_ctx; }
s_kbench() {
  run kbench 400 $B/memra-bench kernels --device 0 --dtypes ${KB_DTYPES:-q4_k,q6_k,q5_0,q4_1,q8_0} \
    --shapes ${KB_SHAPES:-4096x4096,1024x4096,28672x4096,4096x14336,1536x2048,2048x1024} --m ${KB_M:-1,8} --json $O/kbench.json
}
# Products.cu variants staged with PACK_KVARS (each a $KV/NAME), A/B against the default build in
# kbench: names t* / f* (block order, TILE_GROUP) at the prefill shapes and M, the others (p*:
# decode loads in flight, MMQ_PF) at the decode M, F16 and Q4_K.
kvars() { local v; for v in "$KV"/*; do [ -d "$v" ] && echo "${v##*/}"; done; }
kb() { local n=kb-$1-$2-$3 d=$1 w=$2; shift 3
  local kbp="$B/memra-bench kernels --shapes 28672x4096,4096x14336,6144x4096 --m 512,4096 --reps 10"
  local kbd="$B/memra-bench kernels --shapes 28672x4096,4096x14336,6144x4096,4096x4096 --m 1,4,16 --reps 20"
  run $n 150 "$@" $([ $w = pre ] && echo $kbp || echo $kbd) --dtypes $d --json $O/$n.json
  grep -E "r[0-9]+[xwm][g0-9]* |r1s |ALL|MISM" $O/logs/$n.log >> $S; }
s_kvar() {
  for d in f16 q4_k; do kb $d pre def env; kb $d dec def env; done
  for v in $(kvars); do
    case $v in t*|f*) w=pre ;; *) w=dec ;; esac
    for d in f16 q4_k; do kb $d $w $v env MEMRA_KERNEL_DIR=$KV/$v; done
  done
}
# The same workloads with each staged variant (log only: no rows for the README): names t* / f*
# at prefill, the others at decode; SmolLM2 only with a variant named e.
s_kvar_e2e() { for x in q4:Q4_K_M f16:F16 smol:Q4_1; do
  pick $x; waitf $f 60 || continue
  for v in $(kvars); do
    [ $k = f16 ] || [ $k = q4 ] || { [ $k = smol ] && [ $v = e ]; } || continue
    e=MEMRA_KERNEL_DIR=$KV/$v
    case $v in
      t*|f*) run $k-prefill-$v 240 env $e $B/memra-bench prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt ;;
      *) run $k-decode-$v 240 env $e $B/memra-bench decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt ;;
    esac
  done
done; }
# Where F16 prefill's time goes with mws (products were 84% of a 2,000-token step in session 13)
s_f16_ops() {
  run f16-ops 200 env MEMRA_PROFILE_OPS=1 $B/run-gen $F16 --device cuda:0 --no-cuda-graph --prompt "$(python3 -c "print(' '.join(['hello world']*1000))")" --max-tokens 4
}
s_fp8rows() { for x in fp8:$FP8:FP8 nvfp4:$NVFP4:NVFP4 f16:$F16:F16; do
  k=${x%%:*}; r=${x#*:}; f=${r%:*}; dt=${r##*:}
  waitf $f 600 || continue
  mb $k-decode 300 decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape llama3-8b --dtype $dt
  mb $k-prefill 240 prefill $f --device cuda:0 --prompt 512 --runs 3 --shape llama3-8b --dtype $dt
done; }
# an A/B of one switch (AB_VAR, values AB_VALUES, default "0 1"), alternated twice (the switch is
# deleted with the loser once measured)
s_ab() {
  [ -n "${AB_VAR:-}" ] || { row ab "AB_VAR is unset: nothing to A/B"; return 1; }
  for x in ${*:-${AB_MODELS:-smol:Q4_1 gemma:Q4_K_M}}; do pick $x; waitf $f 300 || continue
    for v in ${AB_VALUES:-0 1} ${AB_VALUES:-0 1}; do run ab-$k-$v 200 env $AB_VAR=$v $B/memra-bench decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt --run $RUN-ab$v --out $O/ab.jsonl --quiet; done
  done
}
s_decode80() {
  waitf $Q3N 400 || return
  mb q3n-decode1 200 decode $Q3N --device cuda:0 --prompt 512 --gen 128 --runs 1 --shape qwen3-next-80b-a3b --dtype q4_k_m
  vs q3n $Q3N qwen3-next-80b-a3b
  MEMRA_PROFILE_OPS=1 run q3n-profile 200 $B/run-gen $Q3N --device cuda:0 --prompt "The capital of France is a city that" --max-tokens 48 --no-cuda-graph
  grep -A12 "op profile" $O/logs/q3n-profile.log >> $S
}
# pprof: the op profile of a 512-token prefill (plain steps), then the decode kernels' and the
# 512-token prefill's kernels' own times under ncu at the GPU's clocks (lib.sh kern; no nsys on
# these machines): the plain-step profile charges host gaps to the op after them, so the kernels'
# own times decide what to fuse next.
s_pprof() {
  waitf $Q3N 400 || return
  MEMRA_PROFILE_OPS=1 run q3n-pprof 300 $B/run-gen $Q3N --device cuda:0 --prompt-ids $(seq -s, 1000 1511) --max-tokens 2 --no-cuda-graph
  grep -A16 "op profile" $O/logs/q3n-pprof.log >> $S
  KERN_CLOCK=none kern ${PPROF_KERN:-q3n:Q4_K_M:5000:700}
  # the 512-token prefill's kernels (one step: ~12 launches a layer, 48 layers)
  KERN_CLOCK=none KERN_PROMPT=512 kern ${PPROF_PKERN:-q3n:Q4_K_M:0:900}
  # PPROF_KDET="q3n:Q4_K_M:SKIP:COUNT:REGEX ...": ncu's detailed sections of chosen decode kernels
  [ -n "${PPROF_KDET:-}" ] && kdet $PPROF_KDET
}
# moe30: qwen3-30b-a3b Q4_K_M (the MoE row of issues 35 / 37) in $Q3N's place (the disk holds
# one of them): its side-by-side rows, invariance, and its 512-token prefill's kernels under ncu;
# the file is removed after (mtp80 needs the room).
s_moe30() {
  case " ${LEASE_SYNTH:-} " in *" q3n "*) waitf $Q3N 400 ;; esac
  rm -f $Q3N $Q3N.tmp
  run synth-moe 600 $B/memra-bench synth --shape qwen3-30b-a3b --dtype q4_k_m --tokenizer-from $M/tok.gguf --out $MOE --quiet
  peerwait; sbs moe:Q4_K_M
  vs moe $MOE qwen3-30b-a3b
  run inv-moe 420 $B/memra-verify invariance $MOE --device cuda:0 --max-m 8 --prompt-len 80
  KERN_CLOCK=none KERN_PROMPT=512 kern moe:Q4_K_M:0:700
  rm -f $MOE
}
# mtp80: the 80B oracle file in $Q3N's place (after the steps that read $Q3N), served once as the
# speculating `on` model (MTP only); the plain requests send "speculative": false (memra-bench
# spec --model-off on). The oracle's greedy output repeats the current token, so a verify step's
# rows route to the same experts: its speed-up is an upper bound of a real checkpoint's at that
# acceptance. memra-bench spec fails on any output that differs.
s_mtp80() {
  local q3o=$M/q3n-oracle.gguf pid
  # synth.sh may still be writing $Q3N: let it finish before the file goes
  case " ${LEASE_SYNTH:-} " in *" q3n "*) waitf $Q3N 400 ;; esac
  rm -f $Q3N $Q3N.tmp
  run synth-q3o 900 $B/memra-bench synth --shape qwen3-next-80b-a3b --dtype q4_k_m --mtp 1 --mtp-oracle --tokenizer-from $M/tok.gguf --out $q3o --quiet
  df -h $M | tail -1 >> $S
  MEMRA_MODELS="on=$q3o+spec=mtp" MEMRA_KV_BLOCKS=${SPEC_KV_BLOCKS:-2048} MEMRA_ADDR=127.0.0.1:8091 \
    $B/memra-server > $O/logs/mtp80-server.log 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do curl -s -o /dev/null -w "%{http_code}" 127.0.0.1:8091/ready 2>/dev/null | grep -q 200 && break; sleep 0.5; done
  run spec-mtp80 600 $B/memra-bench spec --addr 127.0.0.1:8091 --model-off on --model-file $q3o --shape qwen3-next-80b-a3b --dtype Q4_K_M \
    --device cuda:0 --run $RUN-mtp80 --out $O/spec.jsonl --repeat 1 --max-tokens 128 --table $O/spec-mtp80.md
  grep -E "grounded|all" $O/spec-mtp80.md 2>/dev/null | cut -c1-200 >> $S
  kill $pid; wait $pid 2>/dev/null
}
# the vision side by side with llama.cpp mtmd (images and logs off $O: 40 MB)
s_mtmd() {
  [ -e $M/mm-g3.gguf ] || run mmproj-g3 180 $B/memra-bench synth-mmproj --shape gemma3 --text-hidden 640 --dtype f16 --out $M/mm-g3.gguf
  waitf $M/mm-g3.gguf 10 && waitf $HOME/gemma.ok 400 || return
  peerwait
  run mtmd 600 env MB=$B/memra-bench RUN=$RUN ROWS=$O/mtmd.jsonl SHAPE=gemma3-270m DTYPE=Q4_K_M \
    tools/device/mtmd_bench.sh $GEMMA $M/mm-g3.gguf $HOME/mtmd
  grep -hE "vision_(encode|ttft)" $O/logs/mtmd.log >> $S
  cp $HOME/mtmd/mtmd-000.log $O/logs/mtmd-llama-first.log 2>/dev/null
  ls $HOME/mtmd/mtmd-*.log 2>/dev/null | tail -n 1 | xargs -r -I{} cp {} $O/logs/mtmd-llama-last.log
}
s_kt() { ktimes ${*:-${PROF_MODELS:-gemma:Q4_K_M moe:Q4_K_M}}; }
s_kern() { kern ${*:-${KERN_MODELS:-gemma:Q4_K_M:1200:220 moe:Q4_K_M:3000:200}}; }
s_kdet() { kdet ${*:-${KDET:-moe:Q4_K_M:40:2:moe_norm_route}}; }
s_ksel() { ksel ${*:-${KSEL_MODELS:-smol:Q4_1 gemma:Q4_K_M}}; }
s_prof() { prof ${*:-${PROF_MODELS:-gemma:Q4_K_M moe:Q4_K_M}}; }

# --- the queue ---
WORDS=; for w in ${STEPS:-}; do WORDS+=" $(preset $w)"; done
WORDS=${WORDS# }
BAD=; for w in $WORDS; do declare -F $(fn $w) > /dev/null || BAD+=" $w"; done
ERR=; [ -z "$BAD" ] || ERR="unknown steps:$BAD (tools/device/lease/queue.sh lists them)"
[ -n "$WORDS" ] || ERR="STEPS is empty: e.g. STEPS=close (tools/device/lease/queue.sh lists the steps)"
if [ "${1:-}" = --check ]; then
  [ -z "$ERR" ] || { echo "queue.sh: $ERR"; exit 1; }
  echo "queue.sh steps: $WORDS"; exit 0
fi
trap 'row queue-done ""; touch $HOME/queue.done' EXIT
[ -z "$ERR" ] || { row start "$ERR: nothing run"; exit 1; }
read -r first _ <<< "$STEPS"   # the run id's default names the first word as given (a preset's name)
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-${first%%=*}}
row start "$MEMRA_COMMIT run $RUN; $WORDS; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
for w in $WORDS; do step $w; done
