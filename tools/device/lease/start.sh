#!/usr/bin/env bash
# start.sh QUEUE [POLL_S]: the first call of a lease, from the repo root on the device with
# .stage/bins.txz (tools/device/stage.sh: pack.sh, then tar + xz of .device), .stage/tok.gguf (a
# GGUF with the tokenizer, for synthetic models), .stage/llama.tgz (peer-src.sh) carried.
# Unpacks the binaries, copies tools/ and verify/ to $HOME/repo, starts the llama.cpp build,
# the synthetic models (synth.sh: LEASE_SYNTH, default "q4 moe") and QUEUE (a script sourcing
# lib.sh, ending with `touch $HOME/queue.done`), all in their own sessions, then polls.
set -u
Q=${1:?queue script}
mkdir -p $HOME/dev $HOME/models $HOME/repo/.stage $HOME/q/logs
tar xf $(ls .stage/bins.t*z | head -1) -C $HOME/dev; cat $HOME/dev/.device/COMMIT
mkdir -p $HOME/repo/bench; cp -r tools verify kernels $HOME/repo/; cp -r bench/workloads $HOME/repo/bench/; cp .stage/llama.tgz $HOME/repo/.stage/ 2>/dev/null
cp .stage/peer*.json .stage/peer*.bin $HOME/repo/.stage/ 2>/dev/null   # peer logits (tools/peer)
cp .stage/tok.gguf $HOME/models/tok.gguf
# precompiled kernels (pack.sh): into the cache lib.sh's MEMRA_KERNEL_CACHE names
[ -d $HOME/dev/.device/kcache ] && mkdir -p $HOME/.cache/memra/kernels && cp $HOME/dev/.device/kcache/* $HOME/.cache/memra/kernels/ && echo "kernels: $(ls $HOME/dev/.device/kcache | wc -l) precompiled"
cd $HOME/repo
export MEMRA_BIN=$HOME/dev/.device/bin
[ -e .stage/llama.tgz ] && tools/device/peer.sh unpack && (setsid nohup tools/device/peer.sh build > /dev/null 2>&1 &)
(setsid nohup tools/device/lease/synth.sh > $HOME/synth.log 2>&1 &)
(setsid nohup bash "$Q" > $HOME/queue.log 2>&1 &)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
tools/device/lease/poll.sh ${2:-5}
