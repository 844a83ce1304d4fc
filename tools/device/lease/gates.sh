#!/usr/bin/env bash
# A short queue: the gates of the defaults as built, nothing timed (for a lease with a few
# device-minutes left). golden (SmolLM2, when carried), every kernel, the tiny MoE / Gemma gates,
# then the F16 8B file's invariance (prompt 700: chunked prefill through the warp-specialized
# product) when LEASE_SYNTH has f16.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
row start "$(cat $HOME/dev/.device/COMMIT) gates; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
run kernels 300 $B/memra-verify kernels --device cuda:0
grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -6 >> $S
for t in qwen3moe gemma3; do run inv-tiny-$t 120 $B/memra-verify invariance --tiny $t --device cuda:0; done
waitf $HOME/smol.ok 30 && run golden 120 $B/memra-verify golden $SMOL --device cuda:0
waitf $F16 200 && run inv-f16 300 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 4
row queue-done ""
touch $HOME/queue.done
