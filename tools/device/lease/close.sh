#!/usr/bin/env bash
# The short closing queue of issue 8 (session 18, ~11 device-minutes with the start): the
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
for x in q4:$Q4:llama3-8b:Q4_K_M q8:$Q8:llama3-8b:Q8_0 f16:$F16:llama3-8b:F16 smol:$SMOL:smollm2-135m:Q4_1; do
  IFS=: read k f sh dt <<< "$x"
  waitf $f 60 || continue
  run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
  peer $k-tg -m $f -p 0 -n 128 -d 512
  run $k-prefill 240 $MB prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt
  peer $k-pp -m $f -p 512,4096 -n 0
done
ln -sf $Q4 $M/synth-llama3-8b-q4_k_m.gguf
run load 420 env OUT=$O/sbs RUN=$RUN SBS_STEPS=load MEMRA_BIN=$B tools/device/sidebyside.sh
grep -h "streaming" $O/sbs/sidebyside.md >> $S 2>/dev/null
row queue-done ""
touch $HOME/queue.done
