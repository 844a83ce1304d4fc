#!/usr/bin/env bash
# close.sh: the gates of the build as staged, then the README's side-by-side rows with llama.cpp
# in ONE run id: the closing run after a change of defaults, or (CLOSE_STEPS=gates) the gates
# alone. Steps (CLOSE_STEPS, default "gates sbs load", in this order):
#   gates  golden; invariance, graph, tokens and serve-invariance of 32 requests on SmolLM2; the
#          whole `memra-verify kernels` (and its attention group on the split kernel);
#          invariance and graph on llama3-8b Q4_K_M; F16 invariance (prompt 700, M to 8); the
#          tiny qwen3moe / gemma3 gates
#   sbs    decode and pp512 / pp4096 of Q4_K_M, Q8_0, F16 and SmolLM2, memra and llama.cpp
#   load   TTFT and the 64-client load row through memra-server and llama-server (Q4_K_M)
#   spec   memra-bench spec through memra-server, speculation on (default) vs off, on SmolLM2,
#          Gemma 3 (when staged: pieces NAME gemma) and Q4_K_M ($SPEC_MODELS)
#   specpeer  the same workload through llama-server, its n-gram speculation on vs off
#          (lib.sh spec_peer; $SPEC_MODELS; after the llama.cpp build): the "vs llama-server" row
#   gemma  the gates on the real Gemma 3 270M (gates_gemma)
#   kt     per-kernel decode times under nsys ($PROF_MODELS)
#   kern   per-kernel decode times under ncu ($KERN_MODELS: k:DTYPE:SKIP:COUNT; KERN_CLOCK=none for
#          the GPU's own clocks)
#   kdet   ncu's detailed sections of chosen kernels at the GPU's own clocks ($KDET:
#          k:DTYPE:SKIP:COUNT:REGEX; lib.sh kdet)
#   ksel   device times of the token-selection kernels in sampled decoding, plain and with
#          n-gram speculation (lib.sh ksel; ncu; $KSEL_MODELS)
#   kgate  the whole `memra-verify kernels` alone (after a kernel change, before the other gates)
#   kbench `memra-bench kernels` (checked against the CPU, then timed): $KB_DTYPES at $KB_SHAPES,
#          M = $KB_M (default the decode products of the staged models' shapes at M 1 and 8)
#   tiny   the tiny qwen3moe / gemma3 / qwen3next gates alone (gates_tiny; no file needed)
#   smol   the SmolLM2 gates alone (gates_smol: golden, invariance, graph, tokens, serve-invariance,
#          n-gram spec; after its pieces)
#   q4inv  invariance and graph on llama3-8b Q4_K_M alone
#   memra  memra's decode rows of $SBS_MODELS without llama.cpp (no peer build to wait for: a
#          short lease compares them with the last run's; not the README's same-run ratios)
#   prof   the per-op decode profile of Gemma 3 and qwen3-30b-a3b ($PROF_MODELS; LEASE_SYNTH moe)
#   long   long context on the 128k Q4_K_M (lib.sh long_ctx: invariance at 8,192 tokens per KV
#          format, serve-invariance over 5,700 tokens, cached-turn TTFT, decode at depth)
# ~8 device-minutes from start.sh to queue-done with the defaults (session 18), ~4 for gates.
#   stage: tools/device/stage.sh; calls: start.sh with LEASE_SYNTH="q4 q8 f16" and this queue,
#   then the two SmolLM2 pieces (NAME smol), then poll.sh back to back (docs/DEVICE.md).
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-close}
STEPS=${CLOSE_STEPS:-gates sbs load}
on() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $STEPS; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
on kgate && { run kernels 600 $B/memra-verify kernels --device cuda:0; grep -E "FAIL|differ|ALL" $O/logs/kernels.log | head -8 >> $S; }
if on gates; then
  gates_smol & gates_8b & wait
  gates_tiny
  row gates-done ""
fi
on kbench && run kbench 400 $B/memra-bench kernels --device 0 --dtypes ${KB_DTYPES:-q4_k,q6_k,q5_0,q4_1,q8_0} \
  --shapes ${KB_SHAPES:-4096x4096,1024x4096,28672x4096,4096x14336,1536x2048,2048x1024} --m ${KB_M:-1,8} --json $O/kbench.json
on tiny && gates_tiny
on smol && gates_smol
on q4inv && waitf $Q4 && run inv-q4 420 $B/memra-verify invariance $Q4 --device cuda:0 && run graph-q4 300 $B/memra-verify graph $Q4 --device cuda:0
if on memra; then for x in ${SBS_MODELS:-q4:Q4_K_M smol:Q4_1}; do pick $x; waitf $f 120 || continue
  run $k-decode 300 $MB decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt; done; fi
on gemma && gates_gemma
if on sbs || on load || on specpeer; then peerwait; fi
on sbs && sbs ${SBS_MODELS:-q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1}
on load && load_row
on spec && spec_rows ${SPEC_MODELS:-smol:Q4_1 gemma:Q4_K_M q4:Q4_K_M}
on specpeer && spec_peer ${SPEC_MODELS:-smol:Q4_1 gemma:Q4_K_M q4:Q4_K_M}
on kt && ktimes ${PROF_MODELS:-gemma:Q4_K_M moe:Q4_K_M}
on kdet && kdet ${KDET:-moe:Q4_K_M:40:2:moe_norm_route}
on ksel && ksel ${KSEL_MODELS:-smol:Q4_1 gemma:Q4_K_M}
on kern && kern ${KERN_MODELS:-gemma:Q4_K_M:1200:220 moe:Q4_K_M:3000:200}
on prof && prof ${PROF_MODELS:-gemma:Q4_K_M moe:Q4_K_M}
on long && long_ctx
row queue-done ""
touch $HOME/queue.done
