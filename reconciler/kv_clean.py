"""`modelpool-kv-clean`: the init container of a persisted llama.cpp member's pod. Before
llama-server starts, it removes the member's slot files on the claim that no restore will
trust (`kv_cache.stale_files`: another UID's, too old, past the size cap), so a claim
shared by several members keeps no more of each than its caps, and a member deleted and
made again under its name finds nothing of the old one. It never fails the pod: a file it
cannot read or remove is reported and left."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from reconciler.kv_cache import OnDisk, stale_files


def _listing(directory: str) -> list[OnDisk]:
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found.append(OnDisk(entry.name, st.st_size, st.st_mtime))
            except OSError as e:
                print(f"kv-clean: {entry.name}: {e}", file=sys.stderr)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelpool-kv-clean", description=__doc__)
    parser.add_argument("--dir", required=True, help="the claim's directory")
    parser.add_argument("--member", required=True)
    parser.add_argument("--uid", required=True, help="the ModelServer's UID")
    parser.add_argument("--max-age", type=float, required=True, help="seconds")
    parser.add_argument("--max-size", type=int, default=None, help="bytes")
    args = parser.parse_args(argv)
    try:
        files = _listing(args.dir)
    except OSError as e:
        print(f"kv-clean: {args.dir}: {e}", file=sys.stderr)
        return 0
    for name in stale_files(files, args.member, args.uid, time.time(), args.max_age,
                            args.max_size):
        try:
            os.remove(os.path.join(args.dir, name))
            print(f"kv-clean: removed {name}")
        except OSError as e:
            print(f"kv-clean: {name} not removed: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
