#!/usr/bin/env bash
# fp8.sh: FP8 and NVFP4 checkpoints on the GPU (issue 37; dequantized to F16 at load, docs/VERIFY.md
# "FP8 and NVFP4"): invariance and graph on tiny FP8 / NVFP4 models, then on the synthetic
# llama3-8b HF folders invariance, serve-invariance and run-gen, and memra's decode and pp512
# rows of FP8, NVFP4 and F16 in one run id (no peer: llama.cpp reads neither format).
#   calls: start.sh with LEASE_SYNTH="fp8 nvfp4 f16" and this queue, then poll.sh back to back
#   (docs/DEVICE.md); no pieces, no llama.tgz needed. ~6 device-minutes (estimate).
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-fp8}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN"
for t in llama+fp8 qwen3+nvfp4 llama+nvfp4; do
  run inv-$t 200 $B/memra-verify invariance --device cuda:0 --tiny $t
  run graph-$t 200 $B/memra-verify graph --device cuda:0 --tiny $t
done
for f in $FP8 $NVFP4; do
  n=$(basename $f)
  waitf $f 600 || continue
  run gen-$n 300 $B/run-gen $f --device cuda:0 --prompt "The capital of France is" --max-tokens 16
  run inv-$n 420 $B/memra-verify invariance $f --device cuda:0 --max-m 16
  run serve-inv-$n 300 $B/memra-verify serve-invariance $f --device cuda:0 --requests 16
done
for x in fp8:$FP8:FP8 nvfp4:$NVFP4:NVFP4 f16:$F16:F16; do
  k=${x%%:*}; r=${x#*:}; f=${r%:*}; dt=${r##*:}
  waitf $f 600 || continue
  run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape llama3-8b --dtype $dt
  run $k-prefill 240 $MB prefill $f --device cuda:0 --prompt 512 --runs 3 --shape llama3-8b --dtype $dt
done
row queue-done ""
touch $HOME/queue.done
