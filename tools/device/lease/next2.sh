#!/usr/bin/env bash
# Session 11's second lease (~3 device-minutes): the F32 product (MoE routers) rewritten after the
# first lease's op profile (the router ~80 us a call): its kernel cases against the CPU and
# across M, MoE invariance / graph (tiny and qwen3-30b-a3b), then qwen3-30b-a3b decode.
#   stage: bins only (no llama.tgz, no pieces); LEASE_SYNTH="moe".
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
run kernels-matmul 120 $B/memra-verify kernels --device cuda:0 --only matmul
run kernels-moe 120 $B/memra-verify kernels --device cuda:0 --only moe
run inv-tiny-moe 120 $B/memra-verify invariance --tiny qwen3moe --device cuda:0
run graph-tiny-moe 120 $B/memra-verify graph --tiny qwen3moe --device cuda:0
waitf $MOE 300 && {
  run moe-decode 150 $MB decode $MOE --device cuda:0 --prompt 512 --gen 128 --runs 1 --shape qwen3-30b-a3b --dtype Q4_K_M
  run inv-moe 150 $B/memra-verify invariance $MOE --device cuda:0 --max-m 8
}
row queue-done ""
touch $HOME/queue.done
