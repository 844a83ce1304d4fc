#!/usr/bin/env bash
# llama.cpp, the peer (docs/DEVICE.md, step 6), on the GPU machine. Its source is the vendored
# llama.cpp of the llama-cpp-python 0.3.36 sdist, trimmed, packed here by tools/device/peer-src.sh
# (`memra-bench peer fetch`) into .stage/llama.tgz (git-ignored; never committed). Built once per
# machine into $HOME/llama.cpp/build; the build can run in the background while memra is measured.
#   tools/device/peer.sh unpack        extract .stage/llama.tgz into $HOME/llama.cpp
#   tools/device/peer.sh build         configure + build llama-bench, llama-server and
#                                      llama-mtmd-cli (tools/device/mtmd_bench.sh) (log:
#                                      $HOME/llama-build.log, last line "build rc=N")
#   tools/device/peer.sh wait          wait for a background build to end
#   tools/device/peer.sh bench FILE..  llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 3 (markdown)
# `build` is `memra-bench peer build --dir $HOME/llama.cpp` (CUDA arch from nvidia-smi, or
# $PEER_ARCH) when memra-bench is here ($MEMRA_BIN, .device/bin or PATH); without it, the same
# cmake recipe below (arch $PEER_ARCH, default 90a; bench/src/peer_build.rs's tests check that
# its flags match).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
LL="$HOME/llama.cpp"
LOG="$HOME/llama-build.log"
MB=""
for d in "${MEMRA_BIN:-}" "$ROOT/.device/bin"; do
  if [ -n "$d" ] && [ -x "$d/memra-bench" ]; then MB="$d/memra-bench"; break; fi
done
[ -n "$MB" ] || MB=$(command -v memra-bench || true)
case "${1:-}" in
  unpack)
    tar xzf "$ROOT/.stage/llama.tgz" -C "$HOME" ;;
  build)
    if [ -n "$MB" ]; then
      {
        cd "$ROOT" && "$MB" peer build --dir "$LL" ${PEER_ARCH:+--arch "$PEER_ARCH"}
        echo "build rc=$?"
      } > "$LOG" 2>&1
      exit 0
    fi
    if [ -x "$LL/build/bin/llama-bench" ] && [ -x "$LL/build/bin/llama-mtmd-cli" ]; then echo "build rc=0 (cached)" >> "$LOG"; exit 0; fi
    cd "$LL" || exit 1
    {
      cmake -S . -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${PEER_ARCH:-90a}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DCMAKE_BUILD_TYPE=Release &&
        nice -n 10 cmake --build build -j14 --target llama-bench llama-server llama-mtmd-cli
      echo "build rc=$?"
    } > "$LOG" 2>&1 ;;
  wait)
    for _ in $(seq 1 600); do grep -q "build rc=" "$LOG" 2>/dev/null && break; sleep 1; done
    tail -n 1 "$LOG" ;;
  bench)
    shift
    for f in "$@"; do
      "$LL/build/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>/dev/null
    done ;;
  *) echo "usage: peer.sh unpack|build|wait|bench FILE..." >&2; exit 2 ;;
esac
