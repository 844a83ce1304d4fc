#!/usr/bin/env bash
# The queue of the next H200 lease (written in session 9 for session 10): the gates of the
# session-9 fixes and everything that lease could not reach, then the side-by-side rows.
#   stage (docs/DEVICE.md "Lease scripts"): bins, tok.gguf, llama.tgz, SmolLM2 (3 pieces,
#   NAME smol), Gemma 3 270M (5 pieces, NAME gemma); LEASE_SYNTH="q4 moe q8 f16".
# Gates run as three streams at once (correctness only); measurements run alone afterwards.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN"
# Warpgroup variants (reports/kernel-notes.md): MWG_PIPE, and MWG_GATHER maps 1-3 (3: the
# 128-byte swizzle through wg_desc_sw128, never run: if only its bits differ, the descriptor is
# at fault)
VARS="pipe g1 g2 g3"
mkdir -p kvar/pipe; { echo '#define MWG_PIPE 1'; cat kernels/cu/products.cu; } > kvar/pipe/products.cu
for g in 1 2 3; do mkdir -p kvar/g$g; { echo "#define MWG_GATHER $g"; cat kernels/cu/products.cu; } > kvar/g$g/products.cu; done
g1() {  # every kernel (grouped MoE k = 1, product_geom of every warpgroup type), MTP on CUDA
  run mtp-spec 300 $B/memra-verify spec --device cuda:0 --tiny llama+mtp --drafters mtp --k-max 4
  run mtp-oracle 300 $B/memra-verify spec --device cuda:0 --tiny llama+mtp-oracle --drafters mtp --k-max 4
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|differ|ALL|product_geom" $O/logs/kernels.log | head -12 >> $S
  for v in $VARS; do
    run geom-$v 300 env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v MEMRA_WGMMA=all $B/memra-verify kernels --device cuda:0 --only product_geom
  done
}
g2() {  # issue 11: bf16 KV at long context
  waitf $Q4 && run inv-8k-bf16 900 $B/memra-verify --kv-dtype bf16 invariance $Q4 --device cuda:0 --prompt-len 8192 --max-m 8
  waitf $Q4 && run serve-inv-5k7-bf16 600 $B/memra-verify --kv-dtype bf16 serve-invariance $Q4 --device cuda:0 --requests 8 --max-tokens 16 --context 5700
}
g3() {  # issue 12: every gate on SmolLM2 on one build
  waitf $HOME/smol.ok 600 && run smol-all 900 $B/memra-verify all --device cuda:0 $SMOL --fixture verify/fixtures/smollm2-135m-reference.json
  grep -E "ALL GREEN|FAIL" $O/logs/smol-all.log | tail -10 >> $S
}
g1 & g2 & g3 & wait
row gates-done ""
peerwait
# issue 11: q8_0 KV at depth 8,192 against llama.cpp q8_0 KV
run q8kv-depth 240 $MB decode $Q4 --device cuda:0 --prompt 512 --depth 8192 --gen 128 --runs 3 --kv-dtype q8_0 --shape llama3-8b --dtype Q4_K_M
peer q4-q8kv -m $Q4 -p 0 -n 128 -d 8192 -ctk q8_0 -ctv q8_0
# issue 16: qwen3-30b-a3b and Gemma 3 against llama.cpp (grouped MoE prefill A/B beside)
run moe-decode 300 $MB decode $MOE --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M
run moe-prefill 300 $MB prefill $MOE --device cuda:0 --prompt 512,2048 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M
run moe-prefill-g0 300 env MEMRA_MOE_GROUPED=0 $B/memra-bench prefill $MOE --device cuda:0 --prompt 512,2048 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M --run $RUN-g0 --out $O/ab.jsonl --quiet
peer moe-tg -m $MOE -p 0 -n 128 -d 512
peer moe-pp -m $MOE -p 512,2048 -n 0
waitf $HOME/gemma.ok 60 && {
  run gemma-decode 200 $MB decode $GEMMA --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  run gemma-prefill 200 $MB prefill $GEMMA --device cuda:0 --prompt 512 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  peer gemma-tg -m $GEMMA -p 0 -n 128 -d 512
  peer gemma-pp -m $GEMMA -p 512 -n 0
}
# issue 8: every row at equal depth (memra: 512-token prompt + 128; llama-bench -d 512 -n 128)
for x in q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1; do
  k=${x%%:*}; dt=${x##*:}
  case $k in q4) f=$Q4 sh=llama3-8b ;; q8) f=$Q8 sh=llama3-8b ;; f16) f=$F16 sh=llama3-8b ;; smol) f=$SMOL sh=smollm2-135m ;; esac
  waitf $f 60 || continue
  run $k-decode 200 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
  run $k-prefill 200 $MB prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt
  peer $k-tg -m $f -p 0 -n 128 -d 512
  peer $k-pp -m $f -p 512,4096 -n 0
done
# the warpgroup kernels of Q6_K (inside Q4_K_M) and Q8_0, against the default
run q4-pp-wgq6 200 env MEMRA_WGMMA=q4_k,q6_k $B/memra-bench prefill $Q4 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-wgq6 --out $O/ab.jsonl --quiet
waitf $Q8 10 && run q8-pp-wgq8 200 env MEMRA_WGMMA=q4_k,q8_0 $B/memra-bench prefill $Q8 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q8_0 --run $RUN-wgq8 --out $O/ab.jsonl --quiet
for v in base $VARS; do
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != base ] && kd=(env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v)
  run kbench-$v 200 "${kd[@]}" MEMRA_WGMMA=all $B/memra-bench kernels --dtypes f16,q4_k,q8_0,q6_k --shapes 14336x4096,4096x14336 --m 512,4096 --reps 5
  grep -E "^ *(f16|q4_k|q8_0|q6_k) .*(512|4096) " $O/logs/kbench-$v.log | head -32 >> $S
done
row queue-done ""
touch $HOME/queue.done
