#!/usr/bin/env bash
# start.sh [POLL_S]: the first call of a lease (docs/DEVICE.md step 3), from the repo root on the
# device with .stage/bins.txz (tools/device/stage.sh: pack.sh, then tar + xz of .device),
# .stage/tok.gguf (a GGUF with the tokenizer, for synthetic models), .stage/llama.tgz
# (peer-src.sh) carried. STEPS says what the queue (tools/device/lease/queue.sh, whose header
# lists every step and preset) runs:
#   STEPS=close LEASE_SYNTH="q4 q8 f16" LEASE_RUN=h200-YYYYMMDD-NAME bash tools/device/lease/start.sh
# Unpacks the binaries, copies tools/ and verify/ to $HOME/repo, checks STEPS (queue.sh --check:
# with a word it does not know nothing is started), then starts the llama.cpp build, the
# synthetic models (synth.sh: LEASE_SYNTH, default "q4 moe") and queue.sh, each in its own
# session, and polls POLL_S seconds (default 5).
set -u
case ${1:-5} in *[!0-9]*)
  echo "start.sh [POLL_S]: the queue is tools/device/lease/queue.sh, its steps in STEPS (e.g. STEPS=close); docs/DEVICE.md step 3"
  exit 2 ;; esac
mkdir -p $HOME/dev $HOME/models $HOME/repo/.stage $HOME/q/logs
tar xf $(ls .stage/bins.t*z | head -1) -C $HOME/dev; cat $HOME/dev/.device/COMMIT
mkdir -p $HOME/repo/bench; cp -r tools verify kernels $HOME/repo/; cp -r bench/workloads $HOME/repo/bench/; cp .stage/llama.tgz $HOME/repo/.stage/ 2>/dev/null
cp .stage/peer*.json .stage/peer*.bin $HOME/repo/.stage/ 2>/dev/null   # peer logits (tools/peer)
cp .stage/tok.gguf $HOME/models/tok.gguf
# precompiled kernels (pack.sh): into the cache lib.sh's MEMRA_KERNEL_CACHE names
[ -d $HOME/dev/.device/kcache ] && mkdir -p $HOME/.cache/memra/kernels && cp $HOME/dev/.device/kcache/* $HOME/.cache/memra/kernels/ && echo "kernels: $(ls $HOME/dev/.device/kcache | wc -l) precompiled"
cd $HOME/repo || exit 1
export MEMRA_BIN=$HOME/dev/.device/bin
bash tools/device/lease/queue.sh --check || exit 1
[ -e .stage/llama.tgz ] && tools/device/peer.sh unpack && (setsid nohup tools/device/peer.sh build > /dev/null 2>&1 &)
(setsid nohup tools/device/lease/synth.sh > $HOME/synth.log 2>&1 &)
(setsid nohup bash tools/device/lease/queue.sh > $HOME/queue.log 2>&1 &)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
tools/device/lease/poll.sh ${1:-5}
