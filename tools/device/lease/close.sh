#!/usr/bin/env bash
# The short closing queue of issue 8 (session 18: ~8 device-minutes from start.sh to queue-done): the
# Done-when gates on the build as staged (golden; invariance, graph, tokens and serve-invariance
# of 32 requests on SmolLM2; the whole `memra-verify kernels`; invariance and graph on llama3-8b
# Q4_K_M; F16 invariance), then every must-reach row side by side with llama.cpp in ONE run id
# (decode and pp512 of Q4_K_M, Q8_0, F16 and SmolLM2; TTFT and the 64-client load row through
# the servers). No MoE / Gemma rows and no A/Bs (next.sh has them).
#   stage: tools/device/stage.sh; calls: start.sh with LEASE_SYNTH="q4 q8 f16" and this queue,
#   then the two SmolLM2 pieces (NAME smol), then poll.sh back to back (docs/DEVICE.md).
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-close}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
gates_smol & gates_8b & wait
row gates-done ""
peerwait
sbs q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1
load_row
row queue-done ""
touch $HOME/queue.done
