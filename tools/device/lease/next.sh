#!/usr/bin/env bash
# The queue of the next H200 lease (written in session 11 for session 12). Session 11 measured
# every side-by-side row in one run (reports/h200-session11-2026-12-03.md) and then wrote, without
# a GPU left, two opt-in kernels from its op profiles: matmul_f32_rows (MEMRA_F32_ROWS=1: the
# qwen3-30b-a3b router, 45% of a decode step) and attn_mma with sliding windows and head_dim 256
# (MEMRA_ATTN_EXT=1: Gemma 3's attention off the CUDA cores). This queue gates them, measures
# them against llama.cpp, and times the F16 warpgroup variants with precompiled cubins.
#   stage: PACK_KVARS="pipe:MWG_PIPE=1 g1:MWG_GATHER=1 g3:MWG_GATHER=3" tools/device/stage.sh
#   (bins with .device/kcache and .device/kvar), tok.gguf, llama.tgz, SmolLM2 (2 calls, NAME
#   smol), Gemma 3 270M (5 pieces, NAME gemma); LEASE_SYNTH="q4 moe f16".
#   After a lost machine: the same with LEASE_SKIP="done steps".
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
KV=$HOME/dev/.device/kvar
NEW=(env MEMRA_F32_ROWS=1 MEMRA_ATTN_EXT=1)
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins; kvar: $(ls $KV 2>/dev/null | tr '\n' ' ')"
g1() {  # the default kernels against the H200's golden records (attn_mma now takes a window
  # argument: with 0 the bits must not move), then every kernel with the new code on (F32 matmul
  # cases, window and head_dim 256 attention)
  waitf $HOME/smol.ok 300 && run golden 300 $B/memra-verify golden $SMOL --device cuda:0
  run kernels-new 600 "${NEW[@]}" $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|differ|ALL" $O/logs/kernels-new.log | head -8 >> $S
  run inv-tiny-moe 200 "${NEW[@]}" $B/memra-verify invariance --tiny qwen3moe --device cuda:0
  run graph-tiny-moe 200 "${NEW[@]}" $B/memra-verify graph --tiny qwen3moe --device cuda:0
  run inv-tiny-gemma 200 "${NEW[@]}" $B/memra-verify invariance --tiny gemma3 --device cuda:0
}
g2() {  # the real models with the new code on
  waitf $HOME/gemma.ok 400 && {
    run inv-gemma 300 "${NEW[@]}" $B/memra-verify invariance $GEMMA --device cuda:0 --prompt-len 700
    run graph-gemma 300 "${NEW[@]}" $B/memra-verify graph $GEMMA --device cuda:0
    run serve-inv-gemma 300 "${NEW[@]}" $B/memra-verify serve-invariance $GEMMA --device cuda:0
  }
  waitf $MOE 400 && run inv-moe 300 "${NEW[@]}" $B/memra-verify invariance $MOE --device cuda:0 --max-m 8
}
g1 & g2 & wait
row gates-done ""
peerwait
# issue 16: qwen3-30b-a3b and Gemma 3, default and new, against llama.cpp
run moe-decode 300 $MB decode $MOE --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M
run moe-decode-f32rows 300 env MEMRA_F32_ROWS=1 $B/memra-bench decode $MOE --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M --run $RUN-f32rows --out $O/ab.jsonl --quiet
peer moe-tg -m $MOE -p 0 -n 128 -d 512
waitf $HOME/gemma.ok 60 && {
  run gemma-decode 200 $MB decode $GEMMA --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  run gemma-decode-ext 200 env MEMRA_ATTN_EXT=1 $B/memra-bench decode $GEMMA --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape gemma3-270m --dtype Q4_K_M --run $RUN-ext --out $O/ab.jsonl --quiet
  peer gemma-tg -m $GEMMA -p 0 -n 128 -d 512
  run gemma-prefill-ext 200 env MEMRA_ATTN_EXT=1 $B/memra-bench prefill $GEMMA --device cuda:0 --prompt 512,4096 --runs 3 --shape gemma3-270m --dtype Q4_K_M --run $RUN-ext --out $O/ab.jsonl --quiet
  run gemma-prefill 200 $MB prefill $GEMMA --device cuda:0 --prompt 512,4096 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  peer gemma-pp -m $GEMMA -p 512,4096 -n 0
}
# issue 8: F16 prefill, the warpgroup variants with precompiled cubins (kernel alone, then end to
# end at 64 tokens per block), and F16 decode against llama.cpp again
for v in base g3; do  # (pipe and g1 dropped in session 12: the lease's minutes go to product_ws)
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != base ] && kd=(env MEMRA_KERNEL_DIR=$KV/$v)
  run kbench-$v 240 "${kd[@]}" MEMRA_WGMMA=all $B/memra-bench kernels --dtypes f16,q4_k --shapes 14336x4096,4096x14336 --m 512,4096 --reps 5
  grep -E "w +[0-9]" $O/logs/kbench-$v.log | head -8 >> $S
done
ab() { local n=$1; shift; run $n 200 env "$@" $B/memra-bench prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16 --run $RUN-$n --out $O/ab.jsonl --quiet; }
# (F16's default since session 11: the warpgroup kernel at 64 tokens per block)
ab f16-pp-g3 MEMRA_KERNEL_DIR=$KV/g3
# product_ws (MEMRA_WGMMA_WS=1, written in session 12, never run before): its bits against every
# other geometry first (short timeout: a wrong mbarrier phase would hang), then timed
if run geom-ws 90 env MEMRA_WGMMA_WS=1 $B/memra-verify kernels --only product_geom --device cuda:0; then
  grep -E "FAIL|differ|ALL" $O/logs/geom-ws.log | head -4 >> $S
  run kbench-ws 150 env MEMRA_WGMMA_WS=1 $B/memra-bench kernels --dtypes f16 --shapes 14336x4096,4096x14336,6144x4096,4096x4096 --m 512,4096 --reps 5
  grep -E "x +[0-9]|w +[0-9]|EQUAL|MISMATCH" $O/logs/kbench-ws.log | head -12 >> $S
  ab f16-pp-ws MEMRA_WGMMA_WS=1
else
  grep -E "FAIL|differ|rror" $O/logs/geom-ws.log | head -4 >> $S
fi
run f16-prefill 200 $MB prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16
peer f16-pp -m $F16 -p 512,4096 -n 0
run f16-decode 300 $MB decode $F16 --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape llama3-8b --dtype F16
peer f16-tg -m $F16 -p 0 -n 128 -d 512
row queue-done ""
touch $HOME/queue.done
