#!/usr/bin/env bash
# Build llama.cpp's llama-server once, into a cache, and write the random-weight model.
#
#   bash benchmarks/fidelity/setup.sh
#
# Cache: ${SIMSIM_LLAMA_CACHE:-$HOME/.cache/simsim/llama}. Afterwards it holds
#   bin/llama-server     the server (plus any shared libraries it was linked against)
#   model.gguf           the random-weight llama model (make_model.py, seeded: same bytes each time)
#   venv/                a small venv with gguf + numpy, only if the calling python lacks them
#   src/, build/         the llama-cpp-python sdist and the cmake build (may be deleted afterwards)
#
# When bin/llama-server already runs (`--version`), nothing is rebuilt. The build uses
# -march=native (llama.cpp's default), so a cached binary belongs to this CPU: delete
# the cache after moving it to another machine.
#
# Environment:
#   SIMSIM_LLAMA_CACHE      the cache folder (above)
#   SIMSIM_LLAMA_PREBUILT   a folder holding an already-built llama-server: copy it (and
#                           the shared libraries it loads from that folder) instead of
#                           downloading and building (used to test this script quickly)
#   PYTHON                  the python to start from (default python3)
#   JOBS                    parallel compile jobs (default: nproc)
#
# The source is llama.cpp as vendored in the llama-cpp-python sdist from the package
# index (the same pinned version everywhere); only the llama-server target is built.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
CACHE="${SIMSIM_LLAMA_CACHE:-$HOME/.cache/simsim/llama}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="$CACHE/bin"

say() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

server_runs() {
    # The libraries sit beside the binary; LD_LIBRARY_PATH wins over the build's RUNPATH.
    [[ -x "$BIN/llama-server" ]] &&
        LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            "$BIN/llama-server" --version >/dev/null 2>&1
}

# Copy a built llama-server and every shared library it loads from its own folder
# (a shared-library build links libllama, libggml... from the build tree). The folder
# goes first on the library path, so that an installed copy (whose RUNPATH still names
# the build tree it came from) gives up its own libraries too.
install_binary() {
    local from
    from="$(cd "$1" && pwd)"
    [[ -x "$from/llama-server" ]] || fail "no executable llama-server in $from"
    mkdir -p "$BIN"
    cp -f "$from/llama-server" "$BIN/llama-server"
    local lib
    while read -r lib; do
        cp -fL "$lib" "$BIN/$(basename "$lib")"
    done < <(LD_LIBRARY_PATH="$from" ldd "$from/llama-server" |
        awk -v dir="$from/" 'index($3, dir) == 1 { print $3 }')
}

build_from_source() {
    command -v cmake >/dev/null || fail "cmake is not installed (needed to build llama-server)"
    command -v c++ >/dev/null || fail "no C++ compiler (c++) found (needed to build llama-server)"
    local pip_python
    pip_python="$(model_python)"
    mkdir -p "$CACHE/src"
    local sdist="$CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
        "$pip_python" -m pip download --quiet --no-binary :all: --no-deps \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$CACHE/src"
    fi
    [[ -f "$sdist" ]] || fail "pip download did not produce $sdist"
    local tree="$CACHE/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    [[ -d "$tree" ]] || tar -xzf "$sdist" -C "$CACHE/src"
    local source="$tree/vendor/llama.cpp"
    [[ -f "$source/CMakeLists.txt" ]] || fail "no llama.cpp source at $source"
    say "configuring llama.cpp in $CACHE/build"
    cmake -S "$source" -B "$CACHE/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON \
        >"$CACHE/cmake.log" 2>&1 || fail "cmake configure failed: see $CACHE/cmake.log"
    say "building llama-server with $JOBS jobs (a few minutes; log: $CACHE/build.log)"
    cmake --build "$CACHE/build" --target llama-server -j "$JOBS" >"$CACHE/build.log" 2>&1 ||
        fail "the build failed: see $CACHE/build.log"
    install_binary "$CACHE/build/bin"
}

# A python that can import gguf and numpy (the caller's, or a venv made for it); it
# also has pip, which downloads the sdist.
model_python() {
    if "$PYTHON" -c 'import gguf, numpy' >/dev/null 2>&1 && "$PYTHON" -m pip --version >/dev/null 2>&1; then
        command -v "$PYTHON"
        return
    fi
    if ! "$CACHE/venv/bin/python" -c 'import gguf, numpy' >/dev/null 2>&1; then
        say "making a venv with gguf and numpy in $CACHE/venv" >&2
        "$PYTHON" -m venv "$CACHE/venv"
        "$CACHE/venv/bin/python" -m pip install --quiet gguf numpy >&2
    fi
    printf '%s\n' "$CACHE/venv/bin/python"
}

mkdir -p "$CACHE"
if server_runs; then
    say "llama-server is ready in $BIN (cached; delete $BIN to rebuild)"
else
    if [[ -n "${SIMSIM_LLAMA_PREBUILT:-}" ]]; then
        say "copying the prebuilt llama-server from $SIMSIM_LLAMA_PREBUILT"
        install_binary "$SIMSIM_LLAMA_PREBUILT"
    else
        build_from_source
    fi
    server_runs || fail "$BIN/llama-server does not run (try: $BIN/llama-server --version)"
    say "llama-server installed in $BIN"
fi

"$(model_python)" "$HERE/make_model.py" "$CACHE/model.gguf"
say "done: server $BIN/llama-server, model $CACHE/model.gguf"
