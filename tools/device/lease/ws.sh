#!/usr/bin/env bash
# Session 14's short queue (a lease of ~6 device-minutes): the bulk-copy feed of the
# warp-specialized F16 product (products.cu MWS_BULK, default 1: ws_image writes the token rows
# in the B layout, one thread fills each slot with 9 bulk copies). Gates its bits
# (product_geom: every geometry, mws included, bitwise against the others), times the F16
# products against the cp.async feed (variant b0: PACK_KVARS="b0:MWS_BULK=0") and the 64-token
# warpgroup launch, then llama3-8b F16 prefill and its invariance.   LEASE_SYNTH=f16
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
run geom 150 $B/memra-verify kernels --device cuda:0 --only product_geom
grep -E "FAIL|differ|ALL" $O/logs/geom.log | head -6 >> $S
KB="$B/memra-bench kernels --dtypes f16 --shapes 14336x4096,4096x14336,6144x4096,4096x4096 --m 512,4096 --reps 10 --launches 8,1,w"
run kb 120 $KB --json $O/kb.json
grep -E "^\s*f16|ALL|differ" $O/logs/kb.log | tail -20 >> $S
run kb-b0 120 env MEMRA_KERNEL_DIR=$HOME/dev/.device/kvar/b0 $KB --json $O/kb-b0.json
waitf $F16 200 && run f16-prefill 150 $MB prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16
waitf $F16 10 && run inv-f16 200 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 4
row queue-done ""
touch $HOME/queue.done
