#!/usr/bin/env bash
# memra-bench with the queue's run id and rows file appended ($B, $RUN, $O from lib.sh):
# the default-configuration rows that go to reports/data/h200.jsonl.
exec "$B/memra-bench" "$@" --run "$RUN" --out "$O/memra.jsonl" --quiet
