#!/usr/bin/env bash
# next.sh: the full queue (run as h200-20261204-s15 / -s16 / -s17). Gates the defaults as built
# (golden, every kernel in `memra-verify kernels`, the gates on SmolLM2 and Q4_K_M: invariance,
# graph, tokens, serve-invariance of 32 requests; F16 invariance on the 8B file, MoE / Gemma
# gates), then measures every side-by-side row with llama.cpp in ONE run id (the README's
# table, MoE and Gemma 3 included), and A/Bs every staged products.cu variant (PACK_KVARS,
# tools/device/pack.sh) in `memra-bench kernels` and end to end (log only). close.sh is the
# short form (no MoE / Gemma rows, no A/Bs).
#   stage: tools/device/stage.sh (bins with .device/kcache),
#   tok.gguf, llama.tgz, SmolLM2 (2 calls, NAME smol), Gemma 3 270M (5 pieces, NAME gemma);
#   LEASE_SYNTH="q4 q8 f16 moe". Keep every call within 30 s of the last (idle release):
#   sessions 15 and 17 lost a machine to a pause (read results AFTER give_back, not between
#   polls). After a lost machine: start.sh again with LEASE_SKIP="done steps" (the peer build
#   then takes ~6 min before the first row). To restart a queue, never `pkill -f next.sh` in a
#   run command: it matches, and kills, the command itself.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
export RUN=${LEASE_RUN:-h200-$(date +%Y%m%d)-lease}
row start "$(cat $HOME/dev/.device/COMMIT) run $RUN; $(ls $MEMRA_KERNEL_CACHE 2>/dev/null | grep -c cubin) cubins"
g1() { gates_smol; gates_8b; }
g2() {
  waitf $HOME/gemma.ok 400 && {
    run inv-gemma 300 $B/memra-verify invariance $GEMMA --device cuda:0 --prompt-len 700
    run serve-inv-gemma 300 $B/memra-verify serve-invariance $GEMMA --device cuda:0
  }
  waitf $MOE 400 && run graph-moe 300 $B/memra-verify graph $MOE --device cuda:0
}
g1 & g2 & wait
gates_tiny
row gates-done ""
# Products.cu variants staged with PACK_KVARS (each a .device/kvar/NAME), A/B against the default
# build in kbench: names t* (block order, TILE_GROUP) at the prefill shapes and M, names p*
# (decode loads in flight, MMQ_PF) at the decode M, F16 and Q4_K.
KV=$HOME/dev/.device/kvar
KBP="$B/memra-bench kernels --shapes 28672x4096,4096x14336,6144x4096 --m 512,4096 --reps 10"
KBD="$B/memra-bench kernels --shapes 28672x4096,4096x14336,6144x4096,4096x4096 --m 1,4,16 --reps 20"
kb() { local n=kb-$1-$2-$3 d=$1 w=$2; shift 3
  run $n 150 "$@" $([ $w = pre ] && echo $KBP || echo $KBD) --dtypes $d --json $O/$n.json
  grep -E "r[0-9]+[xwm][g0-9]* |r1s |ALL|MISM" $O/logs/$n.log >> $S; }
for d in f16 q4_k; do kb $d pre def env; kb $d dec def env; done
for v in $(ls $KV 2>/dev/null); do
  case $v in t*|f*) w=pre ;; *) w=dec ;; esac
  for d in f16 q4_k; do kb $d $w $v env MEMRA_KERNEL_DIR=$KV/$v; done
done
peerwait
# The same workloads with each staged variant (log only: no rows for the README): names t* / f*
# at prefill, the others at decode; SmolLM2 only with a variant named e.
abs() { for x in "$@"; do
  pick $x; waitf $f 60 || continue
  for v in $(ls $KV 2>/dev/null); do
    [ $k = f16 ] || [ $k = q4 ] || { [ $k = smol ] && [ $v = e ]; } || continue
    e=MEMRA_KERNEL_DIR=$KV/$v
    case $v in
      t*|f*) run $k-prefill-$v 240 env $e $B/memra-bench prefill $f --device cuda:0 --prompt 512,4096 --runs 3 --shape $sh --dtype $dt ;;
      *) run $k-decode-$v 240 env $e $B/memra-bench decode $f --device cuda:0 --prompt 512 --gen 128 --runs 3 --shape $sh --dtype $dt ;;
    esac
  done
done; }
# Issue 8's must-reach rows first (session 17 ran out of budget after them), then the server
# load row, then the other models and the A/Bs.
sbs q4:Q4_K_M q8:Q8_0 f16:F16 smol:Q4_1
load_row
sbs moe:Q4_K_M gemma:Q4_K_M
abs q4:Q4_K_M f16:F16 smol:Q4_1
# Where F16 prefill's time goes with mws (products were 84% of a 2,000-token step in session 13)
run f16-ops 200 env MEMRA_PROFILE_OPS=1 $B/run-gen $F16 --device cuda:0 --no-cuda-graph --prompt "$(python3 -c "print(' '.join(['hello world']*1000))")" --max-tokens 4
row queue-done ""
touch $HOME/queue.done
