#!/usr/bin/env bash
# Session 14's second short queue (~4 device-minutes): clusters of two for the bulk-fed
# warp-specialized F16 product (variant c2: PACK_KVARS="c2:MWS_CLUSTER=2 i1:MWS_INFLIGHT=1";
# each weight tile multicast to both CTAs of a pair, 24 instead of 32 KiB from L2 per block and
# k-tile). Bits first (product_geom under c2), then kernel times (default, c2, i1), llama3-8b
# F16 prefill and invariance under c2, prefill under the default, and an op profile of a
# 512-token F16 prefill step.   LEASE_SYNTH=f16
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
C2=$HOME/dev/.device/kvar/c2; I1=$HOME/dev/.device/kvar/i1
run geom-c2 90 env MEMRA_KERNEL_DIR=$C2 $B/memra-verify kernels --device cuda:0 --only product_geom
grep -E "FAIL|differ|ALL" $O/logs/geom-c2.log | head -4 >> $S
KB="$B/memra-bench kernels --dtypes f16 --shapes 14336x4096,4096x14336,6144x4096,4096x4096 --m 512,4096 --reps 10"
run kb-c2 90 env MEMRA_KERNEL_DIR=$C2 $KB --json $O/kb-c2.json
grep -E "nt16r1x" $O/logs/kb-c2.log >> $S
run kb 90 $KB --json $O/kb.json
grep -E "nt16r1x" $O/logs/kb.log >> $S
waitf $F16 120 && run f16-prefill-c2 120 env MEMRA_KERNEL_DIR=$C2 RUN=$RUN-c2 $MB prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16
run inv-f16-c2 150 env MEMRA_KERNEL_DIR=$C2 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 4
run f16-prefill 120 $MB prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16
run kb-i1 90 env MEMRA_KERNEL_DIR=$I1 $KB --json $O/kb-i1.json
grep -E "nt16r1x" $O/logs/kb-i1.log >> $S
run f16-ops 120 env MEMRA_PROFILE_OPS=1 $B/run-gen $F16 --device cuda:0 --no-cuda-graph --prompt "$(python3 -c "print(' '.join(['hello world']*256))")" --max-tokens 2
row queue-done ""
touch $HOME/queue.done
