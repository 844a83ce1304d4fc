#!/usr/bin/env bash
# Builds memra's binaries (memra-server, run-gen) in release mode and installs them into
# ${MEMRA_INSTALL_DIR:-~/.local/bin}.
#   tools/install.sh
# One build serves CPU and GPU: the CUDA backend loads the driver and NVRTC at run time, so a
# machine with an NVIDIA GPU uses it (MEMRA_DEVICE=auto) and one without runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST="${MEMRA_INSTALL_DIR:-$HOME/.local/bin}"
if ! command -v cargo >/dev/null 2>&1; then
  echo "install.sh: cargo not found; install Rust from https://rustup.rs first" >&2
  exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "== GPU detected: $(nvidia-smi -L | head -n 1)"
  echo "   memra-server will use it (MEMRA_DEVICE=auto); the CUDA kernels compile at first use."
else
  echo "== no NVIDIA GPU detected: CPU-only (MEMRA_DEVICE=auto falls back to the CPU)"
fi

echo "== cargo build --release (memra-server, run-gen)"
cargo build --release --locked -p memra-server -p memra-engine --bins

TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p "$DEST"
for bin in memra-server run-gen; do
  install -m 0755 "$TARGET/release/$bin" "$DEST/$bin"
  echo "installed $DEST/$bin"
done
case ":$PATH:" in
  *":$DEST:"*) ;;
  *) echo "note: $DEST is not on your PATH; add it with: export PATH=\"$DEST:\$PATH\"" ;;
esac
echo "next: tools/fetch-models.sh, then memra-server (see docs/SERVING.md)"
