#!/usr/bin/env bash
# The synthetic models of LEASE_SYNTH (q4 moe q8 f16 q3n fp8 nvfp4), one after another, each written to .tmp
# and renamed when complete (queues wait for the final name). ~seconds each on the H200 host.
set -u
cd $HOME/repo; . tools/device/lease/lib.sh
T=$M/tok.gguf
s() { local out=$1; shift; local t0=$SECONDS; $B/memra-bench synth "$@" --tokenizer-from $T --out $out.tmp --quiet && mv $out.tmp $out; echo "$(date +%T) $out rc=$? $((SECONDS-t0))s"; }
for x in ${LEASE_SYNTH:-q4 moe}; do
  case $x in
    q4) s $Q4 --shape llama3-8b --dtype q4_k_m --ctx 131072 --llamacpp-rope ;;
    moe) s $MOE --shape qwen3-30b-a3b --dtype q4_k_m ;;
    q8) s $Q8 --shape llama3-8b --dtype q8_0 --llamacpp-rope ;;
    f16) s $F16 --shape llama3-8b --dtype f16 --llamacpp-rope ;;
    q3n) s $Q3N --shape qwen3-next-80b-a3b --dtype q4_k_m ;;
    fp8) s $FP8 --shape llama3-8b --dtype fp8 --format hf ;;
    nvfp4) s $NVFP4 --shape llama3-8b --dtype nvfp4 --format hf ;;
  esac
done
df -h $M | tail -1
