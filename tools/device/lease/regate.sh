#!/usr/bin/env bash
# regate.sh: the short gate queue of a build that changed kernels, fused ops or new paths but
# not the dense defaults: the whole kernels gate, SmolLM2's gates (golden, invariance, graph,
# tokens, serve-invariance), the tiny qwen3moe / gemma3 / qwen3next gates and default
# speculation, the real Gemma 3's invariance / graph / tokens (reference fixture) /
# serve-invariance, the pipeline split on one GPU (gates_pp), FP8 / NVFP4 (tiny models and a
# llama3-8b FP8 folder: run-gen, invariance), image input on CUDA (`memra-verify vision`: the
# CUDA tower against the CPU tower and its Rust float64 reference, no python; and a real-size
# random tower with Gemma 3 270M, `vision-g3`), and memra's decode rows of Gemma 3 and qwen3-30b-a3b
# (REGATE_DECODE; LEASE_SYNTH="fp8 moe") and speculation rows (REGATE_SPEC, e.g. "smol:Q4_1
# gemma:Q4_K_M") alone after the gates; REGATE_PP=0 / REGATE_FP8=0 leave those lanes out.
# Three lanes in parallel (correctness gates do not depend on timing). ~6 device-minutes.
#   calls: LEASE_SYNTH="fp8 moe" start.sh with this queue; the SmolLM2 pieces (smol), the Gemma 3
#   pieces (gemma); then poll.sh back to back (docs/DEVICE.md).
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h100-$(date +%Y%m%d)-regate}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN"
lane_a() {
  gates_smol
  gates_gemma
}
lane_b() {
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|ALL" $O/logs/kernels.log | head -8 >> $S
  run kernels-attn-split 300 $B/memra-verify kernels --device cuda:0 --only attention --attn-split
  gates_tiny
  [ "${REGATE_PP:-1}" = 0 ] || gates_pp
}
lane_c() {
  [ "${REGATE_FP8:-1}" = 0 ] || fp8_gates
  waitf $HOME/smol.ok 300 && MEMRA_TEST_MODEL=$SMOL run vision 200 $B/memra-verify vision --device cuda:0 --reference f64
  # The CUDA tower at Gemma 3's real size (a random F16 tower, 4096 patches) against the CPU
  # tower, its rows served by Gemma 3 270M (docs/VERIFY.md "The CUDA tower").
  run mmproj-g3 180 $B/memra-bench synth-mmproj --shape gemma3 --text-hidden 640 --dtype f16 --out $M/mm-g3.gguf &&
    waitf $HOME/gemma.ok 400 && run vision-g3 600 $B/memra-verify vision $GEMMA --mmproj $M/mm-g3.gguf --device cuda:0 --reference none --images 2 --prompts 4
}
fp8_gates() {
  for t in llama+fp8 qwen3+nvfp4; do
    run inv-$t 200 $B/memra-verify invariance --device cuda:0 --tiny $t
    run graph-$t 200 $B/memra-verify graph --device cuda:0 --tiny $t
  done
  waitf $FP8 400 && {
    run gen-fp8 300 $B/run-gen $FP8 --device cuda:0 --prompt "The capital of France is" --max-tokens 16
    run inv-fp8 420 $B/memra-verify invariance $FP8 --device cuda:0 --max-m 8
  }
}
lane_a & lane_b & lane_c & wait
# Alone on the GPU after the gates: memra's decode rows of the build (no llama.cpp here: the
# side-by-side rows are close.sh's), then the speculation rows of $REGATE_SPEC (spec_rows).
for x in ${REGATE_DECODE:-gemma:Q4_K_M moe:Q4_K_M}; do
  pick $x; waitf $f 400 && run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
done
[ -n "${REGATE_SPEC:-}" ] && spec_rows $REGATE_SPEC
row queue-done ""
touch $HOME/queue.done
