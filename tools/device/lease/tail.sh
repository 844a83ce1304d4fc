#!/usr/bin/env bash
# Session 11's lease, after kbench-pipe timed out (a MEMRA_KERNEL_DIR variant compiles every
# products build with NVRTC in the process: > 240 s): the rest of next.sh without the variants.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=h200-20261203-s11
ab() { local n=$1; shift; run $n 200 env "$@" $B/memra-bench prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16 --run $RUN-$n --out $O/ab.jsonl --quiet; }
ab f16-pp-wg64 MEMRA_WGMMA=f16 MEMRA_WGMMA_TOKENS=64
ab f16-pp-wg128 MEMRA_WGMMA=f16
for w in 32 64; do
  run q4-decode-w$w 200 env MEMRA_WARPS_PER_SM=$w $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-w$w --out $O/ab.jsonl --quiet
done
run kbench-m1 120 $B/memra-bench kernels --dtypes q4_k,q6_k,f16 --shapes 4096x4096,28672x4096,4096x14336 --m 1 --reps 20
grep -E "s +[0-9]" $O/logs/kbench-m1.log | head -24 >> $S
run q4-pp-wgq6 120 env MEMRA_WGMMA=q4_k,q6_k $B/memra-bench prefill $Q4 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-wgq6 --out $O/ab.jsonl --quiet
run q8-pp-wgq8 120 env MEMRA_WGMMA=q4_k,q8_0 $B/memra-bench prefill $Q8 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q8_0 --run $RUN-wgq8 --out $O/ab.jsonl --quiet
run q4-decode-ops 120 env MEMRA_PROFILE_OPS=1 MEMRA_CUDA_GRAPHS=0 $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 64 --runs 1 --shape llama3-8b --dtype Q4_K_M --run $RUN-ops --out $O/ab.jsonl
row queue-done ""
touch $HOME/queue.done
