#!/usr/bin/env bash
# A short second queue (~7 device-minutes, LEASE_SYNTH="f16 q4"; no llama.cpp, no real models;
# carries .stage/bins.tgz and .stage/tok.gguf). Session 16 ran it to gate the SwiGLU epilogue of
# the warp-specialized product and to A/B MWS_PAIR (slower, deleted), MWS_FENCE=0 and PDL_LATE
# (both faster, now the defaults; the fence's define is deleted since session 17). As kept here it gates the defaults on F16 (memra-verify
# kernels with its `glu` group; F16 invariance through prefill chunks that take mws_glu and
# decode steps that take the split path), then A/Bs every staged products.cu variant in kbench
# (F16 prefill shapes) and end to end (F16 prefill and decode, Q4_K_M decode), and MEMRA_GLU=0 /
# MEMRA_PDL=0 end to end. E.g. the early PDL trigger back:
#   PACK_KVARS="e:PDL_EARLY=1" tools/device/stage.sh
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
KV=$HOME/dev/.device/kvar
VARS=$(ls $KV 2>/dev/null)
env_of() { [ $1 = def ] && echo A=1 || echo MEMRA_KERNEL_DIR=$KV/$1; }
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
run kernels 300 $B/memra-verify kernels --device cuda:0
grep -E "glu|FAIL|differ|ALL" $O/logs/kernels.log | head -12 >> $S
waitf $F16 120 && run inv-f16 420 $B/memra-verify invariance $F16 --device cuda:0 --prompt-len 700 --max-m 8
KBP="$B/memra-bench kernels --dtypes f16 --shapes 28672x4096,4096x14336,6144x4096,4096x4096 --m 512,4096 --reps 10"
for v in def $VARS; do
  run kb-f16-pre-$v 150 env $(env_of $v) $KBP --json $O/kb-f16-pre-$v.json
  grep -E "nt16r1x|ALL|MISM" $O/logs/kb-f16-pre-$v.log >> $S
done
P="$B/memra-bench prefill $F16 --device cuda:0 --prompt 512 --runs 3"
D="$B/memra-bench decode $F16 --device cuda:0 --prompt 512 --gen 128 --runs 2"
for v in def $VARS; do
  run f16-prefill-$v 240 env $(env_of $v) $P
  run f16-decode-$v 200 env $(env_of $v) $D
done
run f16-prefill-glu0 240 env MEMRA_GLU=0 $P
run f16-decode-pdl0 200 env MEMRA_PDL=0 $D
waitf $Q4 60 && for v in def $VARS; do
  run q4-decode-$v 120 env $(env_of $v) $B/memra-bench decode $Q4 --device cuda:0 --prompt 512 --gen 128 --runs 2
done
run f16-ops 200 env MEMRA_PROFILE_OPS=1 $B/run-gen $F16 --device cuda:0 --no-cuda-graph --prompt "$(python3 -c "print(' '.join(['hello world']*250))")" --max-tokens 4
row queue-done ""
touch $HOME/queue.done
