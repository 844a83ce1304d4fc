#!/usr/bin/env bash
# The queue of the H200 lease of session 11. Sessions 10 ran every gate of the session-9 fixes
# green but lost two machines before the side-by-side rows: this queue is mostly those rows, in
# one run id, each memra row with its llama-bench right after it, then the server load, then
# the warpgroup variants timed (kernel alone) and end to end.
#   stage (docs/DEVICE.md "Lease scripts"): bins (with .device/kcache: precompiled kernels),
#   tok.gguf, llama.tgz, SmolLM2 (2 calls, NAME smol), Gemma 3 270M (5 pieces, NAME gemma);
#   LEASE_SYNTH="q4 q8 f16 moe". After a lost machine: the same with LEASE_SKIP="done steps".
# Gates run as two streams at once (correctness only) beside the llama.cpp build; measurements
# run alone afterwards.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
VARS="pipe g1 g3"
mkdir -p kvar/pipe; { echo '#define MWG_PIPE 1'; cat kernels/cu/products.cu; } > kvar/pipe/products.cu
for g in 1 2 3; do mkdir -p kvar/g$g; { echo "#define MWG_GATHER $g"; cat kernels/cu/products.cu; } > kvar/g$g/products.cu; done
g1() {  # the precompiled kernels (cubin, new) against the H200's golden records, then every kernel
  waitf $HOME/smol.ok 300 && run golden-cubin 300 $B/memra-verify golden $SMOL --device cuda:0
  grep -qE "ALL GREEN" $O/logs/golden-cubin.log || run golden-ptx 300 env MEMRA_KERNEL_CUBIN=0 $B/memra-verify golden $SMOL --device cuda:0
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -6 >> $S
  for v in g3; do  # pipe and g1 were green in session 10 (g2: predicted the slowest, not gated)
    run geom-$v 300 env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v MEMRA_WGMMA=all $B/memra-verify kernels --device cuda:0 --only product_geom
  done
}
g2() {  # issue 11: bf16 KV at long context
  waitf $Q4 && run inv-8k-bf16 420 $B/memra-verify --kv-dtype bf16 invariance $Q4 --device cuda:0 --prompt-len 8192 --max-m 8
  waitf $Q4 && run serve-inv-5k7-bf16 300 $B/memra-verify --kv-dtype bf16 serve-invariance $Q4 --device cuda:0 --requests 8 --max-tokens 16 --context 5700
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
# issue 8: 64 streaming clients x 4 requests x 64 tokens through memra-server and llama-server
# -np 64, then TTFT / decode through each server (sidebyside.sh, rows into $O/sbs/data.jsonl)
ln -sf $Q4 $M/synth-llama3-8b-q4_k_m.gguf
run load 420 env OUT=$O/sbs RUN=$RUN SBS_STEPS=load MEMRA_BIN=$B tools/device/sidebyside.sh
grep -h "streaming" $O/sbs/sidebyside.md >> $S 2>/dev/null
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
# issue 11: bf16 KV (default) at depth 8,192 against llama.cpp f16 KV
run bf16-depth 240 $MB decode $Q4 --device cuda:0 --prompt 512 --depth 8192 --gen 128 --runs 3 --shape llama3-8b --dtype Q4_K_M
peer q4-d8k -m $Q4 -p 0 -n 128 -d 8192
# issue 8: the warpgroup variants timed (kernel alone: every geometry of the profile per M, the
# warpgroup launches at 64 and 128 tokens named nt8r1w / nt16r1w), then end to end
for v in base $VARS; do
  kd=(env -u MEMRA_KERNEL_DIR); [ $v != base ] && kd=(env MEMRA_KERNEL_DIR=$HOME/repo/kvar/$v)
  dts=f16,q4_k,q8_0; [ $v = base ] && dts=f16,q4_k,q8_0,q6_k; [ $v = pipe ] && dts=f16,q4_k
  run kbench-$v 240 "${kd[@]}" MEMRA_WGMMA=all $B/memra-bench kernels --dtypes $dts --shapes 14336x4096,4096x14336 --m 512,4096 --reps 5
  grep -E "w +[0-9]" $O/logs/kbench-$v.log | head -24 >> $S
done
ab() { local n=$1; shift; run $n 200 env "$@" $B/memra-bench prefill $F16 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype F16 --run $RUN-$n --out $O/ab.jsonl --quiet; }
ab f16-pp-wg128 MEMRA_WGMMA=f16
ab f16-pp-wg64 MEMRA_WGMMA=f16 MEMRA_WGMMA_TOKENS=64
ab f16-pp-wg64-g1 MEMRA_WGMMA=f16 MEMRA_WGMMA_TOKENS=64 MEMRA_KERNEL_DIR=$HOME/repo/kvar/g1
ab f16-pp-wg64-g3 MEMRA_WGMMA=f16 MEMRA_WGMMA_TOKENS=64 MEMRA_KERNEL_DIR=$HOME/repo/kvar/g3
ab f16-pp-wg128-g3 MEMRA_WGMMA=f16 MEMRA_KERNEL_DIR=$HOME/repo/kvar/g3
run q4-pp-wgq6 200 env MEMRA_WGMMA=q4_k,q6_k $B/memra-bench prefill $Q4 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-wgq6 --out $O/ab.jsonl --quiet
run q8-pp-wgq8 200 env MEMRA_WGMMA=q4_k,q8_0 $B/memra-bench prefill $Q8 --device cuda:0 --prompt 512,4096 --runs 3 --shape llama3-8b --dtype Q8_0 --run $RUN-wgq8 --out $O/ab.jsonl --quiet
# issue 8, decode (Q4_K_M ~0.96x, F16 ~0.99x in earlier runs): the products alone at M = 1 on
# the decode shapes, the per-op split of a step, and more K segments per matrix (nseg: more
# warps in flight at M = 1; changes the arithmetic, so an A/B only)
run kbench-m1 240 $B/memra-bench kernels --dtypes q4_k,q6_k,f16 --shapes 4096x4096,1024x4096,28672x4096,4096x14336 --m 1 --reps 20
grep -E "s +[0-9]" $O/logs/kbench-m1.log | head -24 >> $S
run q4-decode-ops 200 env MEMRA_PROFILE_OPS=1 MEMRA_CUDA_GRAPHS=0 $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 64 --runs 1 --shape llama3-8b --dtype Q4_K_M --run $RUN-ops --out $O/ab.jsonl
for w in 32 64; do
  run q4-decode-w$w 200 env MEMRA_WARPS_PER_SM=$w $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape llama3-8b --dtype Q4_K_M --run $RUN-w$w --out $O/ab.jsonl --quiet
done
row queue-done ""
touch $HOME/queue.done
