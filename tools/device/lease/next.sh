#!/usr/bin/env bash
# The queue of the next H200 lease (written in session 10 for session 11). Session 10 ran every
# gate of the session-9 fixes green (issue 12 resolved) but lost two machines before the side-by-
# side rows: this queue is mostly those rows.
#   stage (docs/DEVICE.md "Lease scripts"): bins (with .device/kcache: precompiled kernels),
#   tok.gguf, llama.tgz, SmolLM2 (2 calls, NAME smol), Gemma 3 270M (5 pieces, NAME gemma);
#   LEASE_SYNTH="q4 q8 f16 moe". After a lost machine: the same with LEASE_SKIP="done steps".
# Gates run as two streams at once (correctness only); measurements run alone afterwards.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
VARS="pipe g1 g2 g3"
mkdir -p kvar/pipe; { echo '#define MWG_PIPE 1'; cat kernels/cu/products.cu; } > kvar/pipe/products.cu
for g in 1 2 3; do mkdir -p kvar/g$g; { echo "#define MWG_GATHER $g"; cat kernels/cu/products.cu; } > kvar/g$g/products.cu; done
g1() {  # the precompiled kernels (cubin, new) against the H200's golden records, then every kernel
  waitf $HOME/smol.ok 300 && run golden-cubin 300 $B/memra-verify golden $SMOL --device cuda:0
  grep -qE "ALL GREEN" $O/logs/golden-cubin.log || run golden-ptx 300 env MEMRA_KERNEL_CUBIN=0 $B/memra-verify golden $SMOL --device cuda:0
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -6 >> $S
  for v in g2 g3; do  # pipe and g1 were green in session 10
    run geom-$v 300 env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v MEMRA_WGMMA=all $B/memra-verify kernels --device cuda:0 --only product_geom
  done
}
g2() {  # issue 11: bf16 KV at long context
  waitf $Q4 && run inv-8k-bf16 600 $B/memra-verify --kv-dtype bf16 invariance $Q4 --device cuda:0 --prompt-len 8192 --max-m 8
  waitf $Q4 && run serve-inv-5k7-bf16 400 $B/memra-verify --kv-dtype bf16 serve-invariance $Q4 --device cuda:0 --requests 8 --max-tokens 16 --context 5700
}
g1 & g2 & wait
row gates-done ""
peerwait
# issue 8: every row at equal depth (memra: 512-token prompt + 128; llama-bench -d 512 -n 128)
for x in q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1; do
  k=${x%%:*}; dt=${x##*:}
  case $k in q4) f=$Q4 sh=llama3-8b ;; q8) f=$Q8 sh=llama3-8b ;; f16) f=$F16 sh=llama3-8b ;; smol) f=$SMOL sh=smollm2-135m ;; esac
  waitf $f 60 || continue
  run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt
  peer $k-tg -m $f -p 0 -n 128 -d 512
  run $k-prefill 200 $MB prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt
  peer $k-pp -m $f -p 512,4096 -n 0
done
# issue 16: qwen3-30b-a3b and Gemma 3 against llama.cpp
run moe-decode 300 $MB decode $MOE --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M
peer moe-tg -m $MOE -p 0 -n 128 -d 512
run moe-prefill 300 $MB prefill $MOE --device cuda:0 --prompt 512,2048 --runs 3 --shape qwen3-30b-a3b --dtype Q4_K_M
peer moe-pp -m $MOE -p 512,2048 -n 0
waitf $HOME/gemma.ok 60 && {
  run gemma-decode 200 $MB decode $GEMMA --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  peer gemma-tg -m $GEMMA -p 0 -n 128 -d 512
  run gemma-prefill 200 $MB prefill $GEMMA --device cuda:0 --prompt 512 --runs 3 --shape gemma3-270m --dtype Q4_K_M
  peer gemma-pp -m $GEMMA -p 512 -n 0
}
# issue 11: q8_0 KV at depth 8,192 against llama.cpp q8_0 KV
run q8kv-depth 240 $MB decode $Q4 --device cuda:0 --prompt 512 --depth 8192 --gen 128 --runs 3 --kv-dtype q8_0 --shape llama3-8b --dtype Q4_K_M
peer q4-q8kv -m $Q4 -p 0 -n 128 -d 8192 -ctk q8_0 -ctv q8_0
# issue 8: the warpgroup variants timed (kernel alone), then the Q6_K / Q8_0 warpgroup A/B
for v in base $VARS; do
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != base ] && kd=(env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v)
  run kbench-$v 200 "${kd[@]}" MEMRA_WGMMA=all $B/memra-bench kernels --dtypes f16,q4_k,q8_0,q6_k --shapes 14336x4096,4096x14336 --m 512,4096 --reps 5
  grep -E "^ *(f16|q4_k|q8_0|q6_k) .*(512|4096) " $O/logs/kbench-$v.log | head -32 >> $S
done
run q4-pp-wgq6 200 env MEMRA_WGMMA=q4_k,q6_k $B/memra-bench prefill $Q4 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-wgq6 --out $O/ab.jsonl --quiet
run q8-pp-wgq8 200 env MEMRA_WGMMA=q4_k,q8_0 $B/memra-bench prefill $Q8 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q8_0 --run $RUN-wgq8 --out $O/ab.jsonl --quiet
row queue-done ""
touch $HOME/queue.done
