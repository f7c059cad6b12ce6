#!/usr/bin/env bash
# llama.cpp's source for llama-bench, llama-batched-bench and llama-server, from the llama-cpp-python
# sdist on PyPI (it vendors llama.cpp), trimmed to what those three tools need with the CPU and CUDA
# backends (~24 MB, ~4 MB packed). Run where PyPI is reachable; the tarball then builds on a GPU machine
# without network access (scripts/bench/build_llama_cpp.sh):
#   bash scripts/llama_cpp/fetch_source.sh DEST [VERSION]      # VERSION default 0.3.36
# Writes DEST/llama.cpp-src.tar.gz and DEST/SOURCE.txt (the sdist, its sha256). llama.cpp's code is
# not part of this repository: a DEST inside the checkout must be git-ignored.
# llama-server needs tools/server, tools/mtmd (server-context links the multimodal library), the
# vendored cpp-httplib / nlohmann json / miniaudio / stb / sheredom (in vendor/), and tools/ui's CMake
# files with scripts/ui-assets.cmake, which generate the embedded web UI table. The sdist holds no
# prebuilt UI (tools/ui/dist): the UI's sources are left out, and the build (LLAMA_BUILD_UI=OFF,
# LLAMA_USE_PREBUILT_UI=OFF, see scripts/bench/build_llama_cpp.sh) embeds an empty table and never
# downloads anything; the server's HTTP API is whole, only its browser page is missing.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/llama_cpp/fetch_source.sh DEST [VERSION]" >&2; exit 2; }
DEST="$(realpath -m "$1")"
VERSION="${2:-0.3.36}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
TRIMMED="$WORK/llama.cpp"
mkdir -p "$TRIMMED/ggml/src" "$TRIMMED/tools/ui" "$TRIMMED/scripts"
cp -r "$SRC/CMakeLists.txt" "$SRC/LICENSE" "$SRC/cmake" "$SRC/src" "$SRC/include" "$SRC/common" "$SRC/vendor" "$SRC/licenses" "$TRIMMED/"
cp -r "$SRC/ggml/CMakeLists.txt" "$SRC/ggml/cmake" "$SRC/ggml/include" "$TRIMMED/ggml/"
# ggml's own sources, and of its backends only the CPU and CUDA ones
find "$SRC/ggml/src" -maxdepth 1 -type f -exec cp {} "$TRIMMED/ggml/src/" \;
cp -r "$SRC/ggml/src/ggml-cpu" "$SRC/ggml/src/ggml-cuda" "$TRIMMED/ggml/src/"
cp -r "$SRC/tools/llama-bench" "$SRC/tools/batched-bench" "$SRC/tools/server" "$SRC/tools/mtmd" "$TRIMMED/tools/"
# the server's and mtmd's tests, benchmarks, sample media and Python helpers are not built
rm -rf "$TRIMMED/tools/server/tests" "$TRIMMED/tools/server/bench" "$TRIMMED/tools/mtmd/tests" "$TRIMMED/tools/mtmd/legacy-models" \
  "$TRIMMED"/tools/mtmd/test-* "$TRIMMED/tools/mtmd/tests.sh"
# the web UI: only what CMake reads to generate its (here empty) asset table
cp "$SRC/tools/ui/CMakeLists.txt" "$SRC/tools/ui/ui.cpp.in" "$SRC/tools/ui/ui.h.in" "$SRC/tools/ui/sources.cmake" "$TRIMMED/tools/ui/"
cp "$SRC/scripts/ui-assets.cmake" "$TRIMMED/scripts/"
# tools/CMakeLists.txt adds every tool; keep these (the rest of its content is flags). As upstream: ui
# and server under LLAMA_BUILD_SERVER, mtmd always (only the targets asked for are built).
cat > "$TRIMMED/tools/CMakeLists.txt" <<'CMAKE'
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
if (LLAMA_BUILD_SERVER)
    add_subdirectory(ui)
    add_subdirectory(server)
endif()
add_subdirectory(mtmd)
CMAKE
# SOURCE.txt beside the tarball and inside it (llama_server_bench.sh records its first line)
{
  echo "llama.cpp as vendored in llama-cpp-python $VERSION (PyPI sdist)"
  echo "sdist sha256: $(sha256sum "$SDIST" | cut -d' ' -f1)"
  echo "trimmed: CMakeLists.txt cmake src include common vendor licenses ggml (CPU and CUDA backends)" \
    "tools/llama-bench tools/batched-bench tools/server tools/mtmd (no tests, media) tools/ui (CMake files only," \
    "no UI assets) scripts/ui-assets.cmake"
} > "$TRIMMED/SOURCE.txt"
mkdir -p "$DEST"
tar czf "$DEST/llama.cpp-src.tar.gz" -C "$WORK" llama.cpp
cp "$TRIMMED/SOURCE.txt" "$DEST/SOURCE.txt"
cat "$DEST/SOURCE.txt"
echo "wrote $DEST/llama.cpp-src.tar.gz ($(du -h "$DEST/llama.cpp-src.tar.gz" | cut -f1))"
