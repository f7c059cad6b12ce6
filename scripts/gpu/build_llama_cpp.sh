#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench with CUDA for Hopper (sm_90) from the tarball
# scripts/llama_cpp/fetch_source.sh wrote (the GPU machine reaches no registry):
#   bash scripts/gpu/build_llama_cpp.sh TARBALL [BUILD_DIR] [CUDA_ARCH]   # default /tmp/llama.cpp, 90
# Prints the two binaries' paths last. Flash attention is a run-time switch (-fa on). CPU only:
# CUDA_ARCH=none configures and builds without CUDA (a quick check of the trimmed tree).
set -euo pipefail
TARBALL="$(realpath "$1")"
BUILD="${2:-/tmp/llama.cpp}"
ARCH="${3:-90}"
mkdir -p "$BUILD"
tar xzf "$TARBALL" -C "$BUILD"
SRC="$BUILD/llama.cpp"
CUDA_FLAGS=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
[ "$ARCH" = none ] && CUDA_FLAGS=(-DGGML_CUDA=OFF)
GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
cmake -S "$SRC" -B "$SRC/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${CUDA_FLAGS[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
[ -n "${CONFIGURE_ONLY:-}" ] && { echo "configured: $SRC/build"; exit 0; }
cmake --build "$SRC/build" --target llama-bench llama-batched-bench -j "$(nproc)"
ls -l "$SRC/build/bin/llama-bench" "$SRC/build/bin/llama-batched-bench"
