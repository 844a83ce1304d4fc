#!/usr/bin/env bash
# hybrid.sh: the queue of issue 34 (qwen3next, gated DeltaNet). Steps (HYBRID_STEPS, default
# all, in this order):
#   gates    the delta kernels and their neighbours (rope, elementwise; GATE_GROUPS: the kernels
#            gate's groups, default with the routers' matmul / moe / fused), then invariance,
#            graph and spec on a tiny random qwen3next
#   serve    serve-invariance (prefix-cache hits from state snapshots) on a tiny qwen3next file
#   mtp      spec with qwen3next's own MTP module (random and oracle-wired: the hand-over check
#            against the CPU, the oracle's acceptance)
#   smol     golden, invariance and serve-invariance on SmolLM2 (staged with piece.sh ... smol): the kernels the
#            hybrid work changed (rope_kv, sigmoid) keep every other model's bits
#   vision   image input on CUDA (issue 38): the vision kernels, the CUDA tower against the CPU
#            tower and its float64 reference on SmolLM2, 225-row images from a tiny tower
#            (prefix hits under load), the Qwen ViT's CUDA tower feeding tiny M-RoPE text models
#            (qwen2vl, qwen25vl, qwen3vl) on CUDA, its video path against the CPU tower's,
#            serve-invariance with image requests (gemma3, qwen2vl, qwen3vl) (piece smol); runs
#            while llama.cpp builds
#   vg3      a real-size random F16 Gemma 3 tower served by Gemma 3 270M (pieces gemma)
#   mtmd     the vision side by side (issue 38): memra-bench vision (the CUDA tower's images/s
#            at 896x896, the TTFT of a one-image request) and llama-mtmd-cli on the same Gemma 3
#            270M, real-size random F16 tower and PNG files (tools/device/mtmd_bench.sh; after
#            peerwait); both engines' rows into $O/mtmd.jsonl under $RUN (pieces gemma)
#   peer     llama.cpp's logits (tools/peer/logits.py on the CPU, carried as .stage/peer16.*:
#            a poll call copies .bin then .json into $HOME/repo/.stage) vs memra's on the GPU
#   ab       an A/B of one switch (AB_VAR=NAME, AB_VALUES, AB_MODELS) on memra decode, alternated
#            (into ab.jsonl; the switch is deleted with the loser once measured)
#   sbs      (HYBRID_SBS, default q3n:Q4_K_M) qwen3-next-80b-a3b Q4_K_M (synthetic, LEASE_SYNTH=q3n) side by side with llama.cpp
#   decode   memra decode alone on that file (one run), then its op profile (plain steps);
#            DECODE_VS=<memra-bench of another build>: both builds' decode, alternated
#            (function vs: also in moe30, on qwen3-30b-a3b)
#   pprof    a 512-token prefill's op profile and the decode kernels' times (ncu, ~one step)
#   inv80    invariance on that file
#   moe30    qwen3-30b-a3b Q4_K_M in its place (removes $Q3N): side by side with llama.cpp,
#            DECODE_VS's alternation as in decode, invariance, the 512-token prefill's kernels under ncu; then removes it
#   mtp80    MTP speculation vs plain at the 80B shape (issue 34): removes $Q3N (the disk holds
#            one 48 GB file), synthesizes qwen3-next-80b-a3b Q4_K_M wired as the MTP oracle
#            (synth --mtp-oracle: its MTP layer drafts the model's own picks) with synth.sh's
#            tokenizer, serves it once (on = +spec=mtp; the plain requests send
#            "speculative": false, memra-bench spec --model-off on) and runs memra-bench spec on
#            the workload (grounded kinds included): tok/s of both, acceptance, whether every
#            output matched (rows into
#            $O/spec.jsonl, table $O/spec-mtp80.md). The oracle's greedy output repeats the
#            current token, so a verify step's rows route to the same experts: its speed-up
#            is an upper bound of a real checkpoint's at that acceptance
#   kernels  the whole kernels gate (before vision: it runs while llama.cpp builds)
#   gsmol    lib.sh's gates_smol (every SmolLM2 gate)
#   ggemma   invariance and tokens on the real Gemma 3 270M (pieces gemma)
# Run order: gates serve mtp peer smol kernels gsmol ggemma vision ab sbs decode pprof inv80 moe30 mtp80
# vg3 mtmd (the qwen3next rows before the steps that wait for the five Gemma pieces; mtp80 after
# every step that reads $Q3N, since it deletes that file).
# Start: LEASE_SYNTH=q3n LEASE_RUN=... bash tools/device/lease/start.sh tools/device/lease/hybrid.sh 5
# then poll.sh back to back (docs/DEVICE.md step 3). ~12 device-minutes for all.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-hybrid}
STEPS=${HYBRID_STEPS:-gates serve peer sbs inv80 kernels}
on() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
row start "$MEMRA_COMMIT $STEPS"
T=$M/q3n-tiny-q8.gguf TF=$M/q3n-tiny-f32.gguf
$B/memra-bench synth --shape tiny-qwen3next --dtype q8_0 --tokenizer-from $M/tok.gguf --out $T --quiet
$B/memra-bench synth --shape tiny-qwen3next --dtype f32 --tokenizer-from $M/tok.gguf --out $TF --quiet
if on gates; then
  run kernels-delta 300 $B/memra-verify kernels --device cuda:0 --only ${GATE_GROUPS:-delta,rope,elementwise,matmul,moe,fused}
  grep -E "FAIL|delta|sigmoid|moe_norm_route" $O/logs/kernels-delta.log | head -12 >> $S
  run inv-tiny 300 $B/memra-verify invariance --device cuda:0 --tiny qwen3next
  run graph-tiny 300 $B/memra-verify graph --device cuda:0 --tiny qwen3next
  run spec-tiny 400 $B/memra-verify spec --device cuda:0 --tiny qwen3next --max-tokens 24 --k-max 4 --drafters ngram,self
fi
on serve && run serve-tiny 400 $B/memra-verify serve-invariance $T --device cuda:0 --requests 16 --context 40
if on mtp; then
  run mtp-tiny 300 $B/memra-verify spec --device cuda:0 --tiny qwen3next+mtp --drafters mtp --k-max 4 --max-tokens 16
  run mtp-oracle 300 $B/memra-verify spec --device cuda:0 --tiny qwen3next+mtp-oracle --drafters mtp --k-max 4 --max-tokens 16
fi
on peer && waitf .stage/peer16.json 120 && run peer-tiny 120 $B/memra-verify peer-logits $TF --peer .stage/peer16.json --device cuda:0
if on smol && waitf $HOME/smol.ok 200; then
  run golden 300 $B/memra-verify golden $SMOL --device cuda:0
  run inv-smol 200 $B/memra-verify invariance $SMOL --device cuda:0
  run serve-inv-smol 300 $B/memra-verify serve-invariance $SMOL --device cuda:0 --requests 32
fi
if on kernels; then
  run kernels 600 $B/memra-verify kernels --device cuda:0
  grep -E "FAIL|ALL" $O/logs/kernels.log | head -6 >> $S
fi
on gsmol && gates_smol
if on ggemma && waitf $HOME/gemma.ok 300; then
  run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0
  run tokens-gemma 300 $B/memra-verify tokens $GEMMA --device cuda:0 --fixture verify/fixtures/gemma3-270m-reference.json
fi
if on vision; then
  run kernels-vision 300 $B/memra-verify kernels --device cuda:0 --only vision
  # The Qwen ViT's CUDA tower (against its CPU tower) feeding M-RoPE text models on CUDA
  # (rope_*_mrope, deepstack rows): tiny random text models with SmolLM2's tokenizer (tok.gguf:
  # no pieces needed). With --reference none the video too: the CUDA tower's video path against
  # the CPU tower's (2e-3), a second encoding bit-identical, greedy tokens of a video prompt fed
  # either rows equal (and, informative, a CPU engine's)
  for fam in qwen2vl qwen25vl qwen3vl; do
    MEMRA_TEST_MODEL=$M/tok.gguf run vision-$fam 300 $B/memra-verify vision --family $fam --device cuda:0 --reference none --images 3 --prompts 4
  done
  # serve-invariance with image requests (one in three; the CUDA tower's rows) on tiny text
  # model files: staggered load, preemption, prefix hits over the image, speculation, sampled
  # and constrained requests, byte-identical to alone (TEXT:TOWER: synth / synth-mmproj shapes)
  for p in gemma3:tiny qwen2vl:tiny-qwen25vl qwen3vl:tiny-qwen3vl; do tx=${p%%:*} mm=${p#*:}
    $B/memra-bench synth --shape tiny-$tx --dtype q8_0 --tokenizer-from $M/tok.gguf --out $M/vl-$tx.gguf --quiet &&
      run mm-$mm 60 $B/memra-bench synth-mmproj --shape $mm --text-hidden 64 --out $M/mm-$mm.gguf &&
      run serve-img-$tx 300 $B/memra-verify serve-invariance $M/vl-$tx.gguf --mmproj $M/mm-$mm.gguf --device cuda:0 --requests 16
  done
  waitf $HOME/smol.ok 200 && MEMRA_TEST_MODEL=$SMOL run vision 200 $B/memra-verify vision --device cuda:0 --reference f64
  # 225-row images (near the real tower's 256) from a cheap tower: serving, prefix hits under load
  run mmproj-long 60 $B/memra-bench synth-mmproj --shape tiny-long --text-hidden 64 --out $M/mm-long.gguf &&
    MEMRA_TEST_MODEL=$SMOL run vision-long 300 $B/memra-verify vision --mmproj $M/mm-long.gguf --device cuda:0 --reference none --images 1 --prompts 4
fi
if on ab; then  # an A/B of one switch (AB_VAR, values AB_VALUES, default "0 1"), alternated twice
  for x in ${AB_MODELS:-smol:Q4_1 gemma:Q4_K_M}; do pick $x; waitf $f 300 || continue
    for v in ${AB_VALUES:-0 1} ${AB_VALUES:-0 1}; do run ab-$k-$v 200 env ${AB_VAR:?AB_VAR}=$v $B/memra-bench decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt --run $RUN-ab$v --out $O/ab.jsonl --quiet; done
  done
fi
if on sbs; then peerwait; sbs ${HYBRID_SBS:-q3n:Q4_K_M}; fi
# vs KEY FILE SHAPE: with DECODE_VS=<another build's memra-bench> (copied to the device outside
# the repo copy, e.g. `gunzip -c .stage/mb-vs.gz > $HOME/mb-vs; DECODE_VS=$HOME/mb-vs ...`), its
# decode row against this build's on FILE (Q4_K_M), alternated VS_ROUNDS times (default 2; each
# run loads the file: ~70 s for qwen3-30b-a3b, ~3 min for the 80B) into vs.jsonl (run ids
# $RUN-vs and $RUN-this); nothing without it.
vs() {
  [ -n "${DECODE_VS:-}" ] || return 0
  for i in $(seq ${VS_ROUNDS:-2}); do
    for who in vs this; do
      bin=$B/memra-bench; [ $who = vs ] && bin=$DECODE_VS
      run $1-$who-decode$i 200 $bin decode $2 --device cuda:0 --prompt 512 --gen 128 --runs 1 --shape $3 --dtype q4_k_m --run $RUN-$who --out $O/vs.jsonl --quiet
    done
  done
}
if on decode && waitf $Q3N 400; then
  run q3n-decode1 200 $MB decode $Q3N --device cuda:0 --prompt 512 --gen 128 --runs 1 --shape qwen3-next-80b-a3b --dtype q4_k_m
  vs q3n $Q3N qwen3-next-80b-a3b
  MEMRA_PROFILE_OPS=1 run q3n-profile 200 $B/run-gen $Q3N --device cuda:0 --prompt "The capital of France is a city that" --max-tokens 48 --no-cuda-graph
  grep -A12 "op profile" $O/logs/q3n-profile.log >> $S
fi
# pprof: the op profile of a 512-token prefill (plain steps), then the decode kernels' and the
# 512-token prefill's kernels' own times under ncu at the GPU's clocks (lib.sh kern; no nsys on these machines): the plain-step profile
# charges host gaps to the op after them, so the kernels' own times decide what to fuse next.
if on pprof && waitf $Q3N 400; then
  MEMRA_PROFILE_OPS=1 run q3n-pprof 300 $B/run-gen $Q3N --device cuda:0 --prompt-ids $(seq -s, 1000 1511) --max-tokens 2 --no-cuda-graph
  grep -A16 "op profile" $O/logs/q3n-pprof.log >> $S
  KERN_CLOCK=none kern ${PPROF_KERN:-q3n:Q4_K_M:5000:700}
  # the 512-token prefill's kernels (one step: ~12 launches a layer, 48 layers)
  KERN_CLOCK=none KERN_PROMPT=512 kern ${PPROF_PKERN:-q3n:Q4_K_M:0:900}
  # PPROF_KDET="q3n:Q4_K_M:SKIP:COUNT:REGEX ...": ncu's detailed sections of chosen decode kernels
  [ -n "${PPROF_KDET:-}" ] && kdet $PPROF_KDET
fi
on inv80 && waitf $Q3N 60 && run inv-q3n 420 $B/memra-verify invariance $Q3N --device cuda:0 --max-m 8 --prompt-len 80
# moe30: qwen3-30b-a3b Q4_K_M (the MoE row of issues 35 / 37) in $Q3N's place (the disk holds
# one of them): its side-by-side rows, invariance, and its 512-token prefill's kernels under ncu;
# the file is removed after (mtp80 needs the room).
if on moe30; then
  case " ${LEASE_SYNTH:-} " in *" q3n "*) waitf $Q3N 400 ;; esac
  rm -f $Q3N $Q3N.tmp
  run synth-moe 600 $B/memra-bench synth --shape qwen3-30b-a3b --dtype q4_k_m --tokenizer-from $M/tok.gguf --out $MOE --quiet
  peerwait; sbs moe:Q4_K_M
  vs moe $MOE qwen3-30b-a3b
  run inv-moe 420 $B/memra-verify invariance $MOE --device cuda:0 --max-m 8 --prompt-len 80
  KERN_CLOCK=none KERN_PROMPT=512 kern moe:Q4_K_M:0:700
  rm -f $MOE
fi
# mtp80: the 80B oracle file in $Q3N's place (after the steps that read $Q3N), served once as the
# speculating `on` model (MTP only); the plain requests opt out per request. memra-bench spec
# fails on any output that differs.
Q3O=$M/q3n-oracle.gguf
if on mtp80; then
  # synth.sh may still be writing $Q3N: let it finish before the file goes
  case " ${LEASE_SYNTH:-} " in *" q3n "*) waitf $Q3N 400 ;; esac
  rm -f $Q3N $Q3N.tmp
  run synth-q3o 900 $B/memra-bench synth --shape qwen3-next-80b-a3b --dtype q4_k_m --mtp 1 --mtp-oracle --tokenizer-from $M/tok.gguf --out $Q3O --quiet
  df -h $M | tail -1 >> $S
  MEMRA_MODELS="on=$Q3O+spec=mtp" MEMRA_KV_BLOCKS=${SPEC_KV_BLOCKS:-2048} MEMRA_ADDR=127.0.0.1:8091 \
    $B/memra-server > $O/logs/mtp80-server.log 2>&1 &
  pid=$!
  for i in $(seq 1 600); do curl -s -o /dev/null -w "%{http_code}" 127.0.0.1:8091/ready 2>/dev/null | grep -q 200 && break; sleep 0.5; done
  run spec-mtp80 600 $B/memra-bench spec --addr 127.0.0.1:8091 --model-off on --model-file $Q3O --shape qwen3-next-80b-a3b --dtype Q4_K_M \
    --device cuda:0 --run $RUN-mtp80 --out $O/spec.jsonl --repeat 1 --max-tokens 128 --table $O/spec-mtp80.md
  grep -E "grounded|all" $O/spec-mtp80.md 2>/dev/null | cut -c1-200 >> $S
  kill $pid; wait $pid 2>/dev/null
fi
if on vg3; then  # the real-size random F16 tower served by Gemma 3 270M (pieces gemma)
  run mmproj-g3 180 $B/memra-bench synth-mmproj --shape gemma3 --text-hidden 640 --dtype f16 --out $M/mm-g3.gguf &&
    waitf $HOME/gemma.ok 400 && run vision-g3 600 $B/memra-verify vision $GEMMA --mmproj $M/mm-g3.gguf --device cuda:0 --reference none --images 2 --prompts 4
fi
if on mtmd; then  # the vision side by side with llama.cpp mtmd (images and logs off $O: 40 MB)
  [ -e $M/mm-g3.gguf ] || run mmproj-g3 180 $B/memra-bench synth-mmproj --shape gemma3 --text-hidden 640 --dtype f16 --out $M/mm-g3.gguf
  if waitf $M/mm-g3.gguf 10 && waitf $HOME/gemma.ok 400; then
    peerwait
    run mtmd 600 env MB=$B/memra-bench RUN=$RUN ROWS=$O/mtmd.jsonl SHAPE=gemma3-270m DTYPE=Q4_K_M \
      tools/device/mtmd_bench.sh $GEMMA $M/mm-g3.gguf $HOME/mtmd
    grep -hE "vision_(encode|ttft)" $O/logs/mtmd.log >> $S
    cp $HOME/mtmd/mtmd-000.log $O/logs/mtmd-llama-first.log 2>/dev/null
    ls $HOME/mtmd/mtmd-*.log 2>/dev/null | tail -n 1 | xargs -r -I{} cp {} $O/logs/mtmd-llama-last.log
  fi
fi
touch $HOME/queue.done
