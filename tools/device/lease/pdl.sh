#!/usr/bin/env bash
# Session 15's short queue (~4 device-minutes): programmatic dependent launch (device.rs
# launch_pdl, prelude.cuh pdl_entry; default on sm_90+, MEMRA_PDL=0 the A/B). Gates the bits on
# SmolLM2 (golden, CUDA graph, batch / chunk invariance), then times decode and prefill with it
# and without it on SmolLM2 (launch-bound) and llama3-8b Q4_K_M.   LEASE_SYNTH=q4
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
waitf $HOME/smol.ok 120 && {
  run golden 60 $B/memra-verify golden $SMOL --device cuda:0
  run graph-smol 90 $B/memra-verify graph $SMOL --device cuda:0
  run inv-smol 120 $B/memra-verify invariance $SMOL --device cuda:0 --max-m 8
  for p in 1 0; do
    run smol-decode-pdl$p 60 env MEMRA_PDL=$p $B/memra-bench decode $SMOL --device cuda:0 --prompt 512 --gen 128 --runs 3
    run smol-prefill-pdl$p 60 env MEMRA_PDL=$p $B/memra-bench prefill $SMOL --device cuda:0 --prompt 512 --runs 3
  done
}
waitf $Q4 120 && for p in 1 0; do
  run q4-decode-pdl$p 90 env MEMRA_PDL=$p $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 128 --runs 2
done
row queue-done ""
touch $HOME/queue.done
