#!/usr/bin/env bash
# The queue of the next H200 lease (written in session 13, second lease). Session 13's first lease
# (reports/h200-session13-2026-12-03.md) gated matmul_f32_rows and the windowed / head_dim 256
# attn_mma (now the defaults) and found product_ws "missing": its kernels were not in the products
# module's kernel list. This queue runs product_ws (MEMRA_WGMMA_WS=1) in its two builds: one wgmma
# group in flight (default) and MWS_INFLIGHT=0 (kvar w0), bits first, then timed, then F16 prefill.
#   stage: PACK_KVARS="w0:MWS_INFLIGHT=0" tools/device/stage.sh; carry bins.tgz, tok.gguf,
#   llama.tgz (no real models needed); LEASE_SYNTH="f16".
#   After a lost machine: the same with LEASE_SKIP="done steps".
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
KV=$HOME/dev/.device/kvar
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins; kvar: $(ls $KV 2>/dev/null | tr '\n' ' ')"
# The new defaults (F32 routers, windowed / head_dim 256 attention) on the tiny models.
run inv-tiny-moe 200 $B/memra-verify invariance --tiny qwen3moe --device cuda:0
run inv-tiny-gemma 200 $B/memra-verify invariance --tiny gemma3 --device cuda:0
ok=()
for v in ws w0; do  # product_ws: its bits against every other geometry (short: a wrong mbarrier phase hangs)
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != ws ] && kd=(env MEMRA_KERNEL_DIR=$KV/$v)
  if run geom-$v 90 "${kd[@]}" MEMRA_WGMMA_WS=1 $B/memra-verify kernels --only product_geom --device cuda:0; then ok+=($v); fi
  grep -E "FAIL|differ|ALL|rror" $O/logs/geom-$v.log | head -4 >> $S
done
for v in "${ok[@]}"; do
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != ws ] && kd=(env MEMRA_KERNEL_DIR=$KV/$v)
  run kbench-$v 150 "${kd[@]}" MEMRA_WGMMA_WS=1 $B/memra-bench kernels --dtypes f16 --shapes 14336x4096,4096x14336,6144x4096,4096x4096 --m 512,4096 --reps 5
  grep -E "x +[0-9]|w +[0-9]|EQUAL|MISMATCH" $O/logs/kbench-$v.log | head -20 >> $S
done
ab() { local n=$1; shift; run $n 200 env "$@" $B/memra-bench prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16 --run $RUN-$n --out $O/ab.jsonl --quiet; }
waitf $F16 400 && {
  for v in "${ok[@]}"; do
    if [ $v = ws ]; then ab f16-pp-ws MEMRA_WGMMA_WS=1; else ab f16-pp-$v MEMRA_WGMMA_WS=1 MEMRA_KERNEL_DIR=$KV/$v; fi
  done
  run f16-prefill 200 $MB prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16
}
row queue-done ""
touch $HOME/queue.done
