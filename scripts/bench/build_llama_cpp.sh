#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-batched-bench and llama-server with CUDA for Hopper (sm_90) from
# the tarball scripts/llama_cpp/fetch_source.sh wrote (the GPU machine reaches no registry):
#   bash scripts/bench/build_llama_cpp.sh TARBALL BUILD_DIR [CUDA_ARCH]   # CUDA_ARCH default 90
# Prints the three binaries' paths last (BUILD_DIR/llama.cpp/build/bin/). Flash attention is a run-time
# switch (-fa on). CPU only: CUDA_ARCH=none configures and builds without CUDA (a quick check of the
# trimmed tree). CONFIGURE_ONLY=1 stops after cmake's configure step; TARGETS="llama-bench ..." builds
# fewer (default: the three).
# Nothing is fetched: no OpenSSL (no HTTPS in common's downloader), and the server's web UI is neither
# built with npm nor downloaded (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF): llama-server embeds an
# empty UI table, its HTTP API (/health, /v1/chat/completions, /metrics) is unaffected.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bash scripts/bench/build_llama_cpp.sh TARBALL BUILD_DIR [CUDA_ARCH]" >&2; exit 2; }
TARBALL="$(realpath "$1")"
BUILD="$2"
ARCH="${3:-90}"
mkdir -p "$BUILD"
tar xzf "$TARBALL" -C "$BUILD"
SRC="$BUILD/llama.cpp"
CUDA_FLAGS=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
[ "$ARCH" = none ] && CUDA_FLAGS=(-DGGML_CUDA=OFF)
GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$SRC/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${CUDA_FLAGS[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
[ -n "${CONFIGURE_ONLY:-}" ] && { echo "configured: $SRC/build"; exit 0; }
read -r -a TARGETS <<< "${TARGETS:-llama-bench llama-batched-bench llama-server}"
cmake --build "$SRC/build" --target "${TARGETS[@]}" -j "$(nproc)"
ls -l "${TARGETS[@]/#/$SRC/build/bin/}"
