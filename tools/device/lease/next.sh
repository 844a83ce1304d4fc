#!/usr/bin/env bash
# The queue of the next H200 lease (written in session 13, extended in session 14). Sessions 13
# and 14 made four kernels the defaults from A/B rows (reports/h200-session13-2026-12-03.md,
# reports/h200-session14-2026-12-04.md): matmul_f32_rows (MoE routers), attn_mma for sliding
# windows / head_dim 256 (Gemma 3), the warp-specialized F16 product mws (MWS_INFLIGHT 0) and its
# bulk-copy feed (MWS_BULK 1). This queue gates the defaults as built (golden, every kernel with
# mws in products_check, F16 invariance on the 8B file, MoE / Gemma gates), then measures every
# side-by-side row in ONE run id so the README's table is one run again (session 14's F16 pp512,
# 20,157 tok/s, has no llama.cpp row in its own run), and A/Bs every staged products.cu variant
# (session 15: g0 = TILE_GROUP 0, the products' old block order; i1 = MWS_INFLIGHT 1) in kbench
# and in F16 / Q4_K_M prefill (log only).
#   stage: PACK_KVARS="g0:TILE_GROUP=0 i1:MWS_INFLIGHT=1" tools/device/stage.sh (bins with .device/kcache),
#   tok.gguf, llama.tgz, SmolLM2 (2 calls, NAME smol), Gemma 3 270M (5 pieces, NAME gemma);
#   LEASE_SYNTH="q4 q8 f16 moe".
#   After a lost machine: the same with LEASE_SKIP="done steps".
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
g1() {
  waitf $HOME/smol.ok 300 && run golden 300 $B/memra-verify golden $SMOL --device cuda:0
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -6 >> $S
  waitf $F16 && run inv-f16 420 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 8
}
g2() {
  waitf $HOME/gemma.ok 400 && {
    run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0 --prompt-len 700
    run serve-inv-gemma 300 $B/memra-verify serve-invariance $GEMMA --device cuda:0
  }
  waitf $MOE 400 && run graph-moe 300 $B/memra-verify graph $MOE --device cuda:0
}
g1 & g2 & wait
row gates-done ""
# Products.cu variants staged with PACK_KVARS (each a .device/kvar/NAME): kbench A/B against the
# default build, F16 and Q4_K at the llama3-8b shapes (28672 x 4096: the fused gate/up).
KV=$HOME/dev/.device/kvar
KB="$B/memra-bench kernels --shapes 28672x4096,4096x14336,6144x4096 --m 512,4096 --reps 10"
kb() { local n=kb-$1-${2:-def} d=$1; shift 2
  run $n 150 "$@" $KB --dtypes $d --json $O/$n.json; grep -E "r[0-9]+[xwm] |ALL|MISM" $O/logs/$n.log >> $S; }
kb f16 "" env; kb q4_k "" env
for v in $(ls $KV 2>/dev/null); do
  kb f16 $v env MEMRA_KERNEL_DIR=$KV/$v
  [ $v = g0 ] && kb q4_k $v env MEMRA_KERNEL_DIR=$KV/$v
done
peerwait
for x in q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1 moe:Q4_K_M gemma:Q4_K_M; do
  k=${x%%:*}; dt=${x##*:}
  case $k in q4) f=$Q4 sh=llama3-8b ;; q8) f=$Q8 sh=llama3-8b ;; f16) f=$F16 sh=llama3-8b ;;
    smol) f=$SMOL sh=smollm2-135m ;; moe) f=$MOE sh=qwen3-30b-a3b ;; gemma) f=$GEMMA sh=gemma3-270m ;; esac
  waitf $f 60 || continue
  run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
  peer $k-tg -m $f -p 0 -n 128 -d 512
  run $k-prefill 240 $MB prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt
  peer $k-pp -m $f -p 512,4096 -n 0
  # the same prefill with each staged variant (log only: no rows for the README)
  for v in $(ls $KV 2>/dev/null); do
    [ $k = f16 ] || [ $k = q4 ] || continue
    run $k-prefill-$v 240 env MEMRA_KERNEL_DIR=$KV/$v $B/memra-bench prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt
  done
done
ln -sf $Q4 $M/synth-llama3-8b-q4_k_m.gguf
run load 420 env OUT=$O/sbs RUN=$RUN SBS_STEPS=load MEMRA_BIN=$B tools/device/sidebyside.sh
grep -h "streaming" $O/sbs/sidebyside.md >> $S 2>/dev/null
# Where F16 prefill's time goes with mws (products were 84% of a 2,000-token step in session 13)
run f16-ops 200 env MEMRA_PROFILE_OPS=1 $B/run-gen $F16 --device cuda:0 --no-cuda-graph --prompt "$(python3 -c "print(' '.join(['hello world']*1000))")" --max-tokens 4
row queue-done ""
touch $HOME/queue.done
