#!/usr/bin/env bash
# hybrid.sh: the queue of issue 34 (qwen3next, gated DeltaNet), ~12 device-minutes: the delta
# kernels and the kernels whose launch it changed (rope, elementwise), the gates on a tiny
# random qwen3next (invariance, graph, spec), then the real shape (qwen3-next-80b-a3b Q4_K_M,
# synthetic, LEASE_SYNTH=q3n) side by side with llama.cpp and its invariance, then the whole
# kernels gate. Start it with
#   LEASE_SYNTH=q3n LEASE_RUN=h200-YYYYMMDD-x bash tools/device/lease/start.sh tools/device/lease/hybrid.sh 5
# then poll.sh back to back (docs/DEVICE.md "Lease scripts").
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
RUN=${LEASE_RUN:-h200-hybrid}
row start "$MEMRA_COMMIT"
run kernels-delta 300 $B/memra-verify kernels --device cuda:0 --only delta,rope,elementwise
grep -E "FAIL|delta|sigmoid|rope" $O/logs/kernels-delta.log | head -12 >> $S
run inv-tiny 300 $B/memra-verify invariance --device cuda:0 --tiny qwen3next
run graph-tiny 300 $B/memra-verify graph --device cuda:0 --tiny qwen3next
run spec-tiny 400 $B/memra-verify spec --device cuda:0 --tiny qwen3next --max-tokens 24 --k-max 4 --drafters ngram,self
# llama.cpp's logits (tools/peer/logits.py, CPU) on the same tiny file: .stage/peer16.bin then
# .json, carried by a poll call (cp .stage/peer16.bin .stage/peer16.json $HOME/repo/.stage/)
$B/memra-bench synth --shape tiny-qwen3next --dtype f32 --tokenizer-from $M/tok.gguf --out $M/q3n-tiny-f32.gguf --quiet
waitf .stage/peer16.json 120 && run peer-tiny 120 $B/memra-verify peer-logits $M/q3n-tiny-f32.gguf --peer .stage/peer16.json --device cuda:0
peerwait
sbs q3n:q4_k_m
waitf $Q3N 60 && run inv-q3n 420 $B/memra-verify invariance $Q3N --device cuda:0 --max-m 8 --prompt-len 80
run kernels 600 $B/memra-verify kernels --device cuda:0
grep -E "FAIL|ALL" $O/logs/kernels.log | head -6 >> $S
touch $HOME/queue.done
