#!/usr/bin/env bash
# pp.sh: pipeline stages (issue 41) on the lent GPU(s): lib.sh gates_pp, i.e. `memra-verify pp`
# (the model split at several layer boundaries vs unsplit: tokens, logits bits, KV bytes) on
# tiny llama / gemma3 / qwen3next / qwen3moe and SmolLM2, and invariance / graph /
# serve-invariance with --pp 2 on SmolLM2. One GPU: both stages on cuda:0 (the default);
# two GPUs: PP_DEVICES=cuda:0,cuda:1 (the peer-copy hand-over). ~3 device-minutes.
#   stage: tools/device/stage.sh; calls: LEASE_SYNTH=none start.sh with this queue (no synthetic model),
#   then the two SmolLM2 pieces (NAME smol), then poll.sh back to back (docs/DEVICE.md).
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-pp}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; pp on ${PP_DEVICES:-cuda:0,cuda:0}"
gates_pp
row queue-done ""
touch $HOME/queue.done
