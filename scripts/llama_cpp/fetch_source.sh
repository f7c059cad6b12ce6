#!/usr/bin/env bash
# llama.cpp's source for llama-bench and llama-batched-bench, from the llama-cpp-python sdist on PyPI
# (it vendors llama.cpp), trimmed to what those two tools need with the CPU and CUDA backends (~20 MB,
# ~4 MB packed). Run where PyPI is reachable; the GPU machine is not, so the tarball travels to it:
#   bash scripts/llama_cpp/fetch_source.sh [VERSION] [DEST]      # default 0.3.36, .carry/llama.cpp
# Writes DEST/llama.cpp-src.tar.gz and DEST/SOURCE.txt (the sdist, its sha256). llama.cpp's code is
# not part of this repository: DEST must be git-ignored (.carry/ is).
set -euo pipefail
VERSION="${1:-0.3.36}"
DEST="$(realpath -m "${2:-.carry/llama.cpp}")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
OUT="$WORK/llama.cpp"
mkdir -p "$OUT/ggml/src" "$OUT/tools"
cp -r "$SRC/CMakeLists.txt" "$SRC/LICENSE" "$SRC/cmake" "$SRC/src" "$SRC/include" "$SRC/common" "$SRC/vendor" "$SRC/licenses" "$OUT/"
cp -r "$SRC/ggml/CMakeLists.txt" "$SRC/ggml/cmake" "$SRC/ggml/include" "$OUT/ggml/"
# ggml's own sources, and of its backends only the CPU and CUDA ones
find "$SRC/ggml/src" -maxdepth 1 -type f -exec cp {} "$OUT/ggml/src/" \;
cp -r "$SRC/ggml/src/ggml-cpu" "$SRC/ggml/src/ggml-cuda" "$OUT/ggml/src/"
cp -r "$SRC/tools/llama-bench" "$SRC/tools/batched-bench" "$OUT/tools/"
# tools/CMakeLists.txt adds every tool; keep the two (the rest of its content is flags)
cat > "$OUT/tools/CMakeLists.txt" <<'CMAKE'
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
CMAKE
mkdir -p "$DEST"
tar czf "$DEST/llama.cpp-src.tar.gz" -C "$WORK" llama.cpp
{
  echo "llama.cpp as vendored in llama-cpp-python $VERSION (PyPI sdist)"
  echo "sdist sha256: $(sha256sum "$SDIST" | cut -d' ' -f1)"
  echo "trimmed: CMakeLists.txt cmake src include common vendor licenses ggml (CPU and CUDA backends) tools/llama-bench tools/batched-bench"
} > "$DEST/SOURCE.txt"
cat "$DEST/SOURCE.txt"
echo "wrote $DEST/llama.cpp-src.tar.gz ($(du -h "$DEST/llama.cpp-src.tar.gz" | cut -f1))"
