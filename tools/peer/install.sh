#!/usr/bin/env bash
# Installs llama-cpp-python 0.3.36 (the peer's vendored llama.cpp, the same source the device
# builds) as a CPU build for tools/peer/logits.py and tools/peer/mtmd.py (libmtmd comes with it):
# ~10 minutes on 2 cores, once per machine.
#   tools/peer/install.sh
set -euo pipefail
PY="${PYTHON:-python3}"
if "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '0.3.36')" 2>/dev/null; then
  echo "llama-cpp-python 0.3.36 is installed"; exit 0
fi
"$PY" -m pip install --quiet scikit-build-core numpy typing_extensions diskcache jinja2
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$PY" -m pip install --no-deps --no-cache-dir llama-cpp-python==0.3.36
