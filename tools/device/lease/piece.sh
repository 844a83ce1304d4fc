#!/usr/bin/env bash
# piece.sh PIECE... NAME [FINAL.gguf]: append carried pieces to $HOME/models/NAME.part; with
# FINAL, check its sha256 against NAME.sha beside this script (the call's own working tree, so a
# piece call needs nothing from start.sh: session 10's first call was refused while its pieces
# went to a bare machine), rename it to $HOME/models/FINAL and touch $HOME/NAME.ok (queues wait
# for that file: queue.sh steps).
set -u
args=("$@"); n=${#args[@]}
if [[ "${args[$((n-1))]}" == *.gguf ]]; then final=${args[$((n-1))]}; name=${args[$((n-2))]}; pieces=("${args[@]:0:$((n-2))}")
else final=""; name=${args[$((n-1))]}; pieces=("${args[@]:0:$((n-1))}"); fi
P=$HOME/models/$name.part
mkdir -p $HOME/models && cat "${pieces[@]}" >> $P && ls -la $P
if [ -n "$final" ]; then
  echo "$(cat "$(dirname "$0")/$name.sha")  $P" | sha256sum -c - && mv $P $HOME/models/$final && touch $HOME/$name.ok
fi
[ -e $HOME/dev/.device/COMMIT ] || echo "LEASE NOT STARTED on this machine: call STEPS=... start.sh (carry bins.txz, tok.gguf, llama.tgz; docs/DEVICE.md step 3)"
