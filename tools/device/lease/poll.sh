#!/usr/bin/env bash
# poll.sh SECONDS: wait for queue.sh to end (keeps the machine held: it is handed back ~30 s
# after a call returns, whatever runs on it), then print the summary and copy $HOME/q to $OUT.
[ -e $HOME/dev/.device/COMMIT ] || { echo "LEASE NOT STARTED on this machine (a fresh one?): call STEPS=... start.sh now"; ls $HOME/models 2>/dev/null; exit 0; }
for i in $(seq 1 $(( ${1:-60} / 5 ))); do [ -e $HOME/queue.done ] && break; sleep 5; done
cat $HOME/q/summary.txt 2>/dev/null; tail -1 $HOME/llama-build.log 2>/dev/null; ls $HOME/models
mkdir -p $OUT/q && cp -r $HOME/q/* $OUT/q/ 2>/dev/null; true
