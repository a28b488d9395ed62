"""How long a real llama-server takes to load a model, from a cold page cache and from a
warm one: where a real swap spends its time.

Starts the real `llama-server` (e2e/llama/build-llama-server.sh) on the generated models
(e2e/llama/models.py, tiny and large), and measures exec to the first `/health` 200, with
the weights mapped (llama.cpp's default: pages are read as they are first touched) and read
whole (`--load-mode none`: the load reads every byte). Cold:
the page cache dropped first (`echo 3 > /proc/sys/vm/drop_caches`, as root); warm: the file
read just before. Rounds alternate cold and warm.

    .venv/bin/python benchmarks/bench_llama_load.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e.llama import models  # noqa: E402


def binary() -> str:
    out = subprocess.run(["bash", str(REPO / "e2e" / "llama" / "build-llama-server.sh")],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def warm(path: Path) -> None:
    with path.open("rb") as f:
        while f.read(1 << 22):
            pass


def load_time(server: str, model: Path, mmap: bool) -> float:
    port = free_port()
    started = time.monotonic()
    flags = [] if mmap else ["--load-mode", "none"]
    process = subprocess.Popen([server, "--model", str(model), "--host", "127.0.0.1",
                                "--port", str(port), "-c", "512", "-np", "1", *flags],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited {process.returncode}")
            time.sleep(0.005)
    finally:
        process.terminate()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = binary()
    directory = Path(tempfile.mkdtemp(prefix="llama-load-"))
    sizes = {size: models.write_model(directory, "bench", size) for size in ("tiny", "large")}
    results: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.rounds):
        for size, path in sizes.items():
            for read in ("mmap", "read"):
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        drop_caches()
                    else:
                        warm(path)
                    t = load_time(server, path, read == "mmap")
                    results.setdefault((size, read, cache), []).append(t)
    print(f"llama-server exec to /health 200, {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.1f}:")
    print("| model | size | weights read | page cache | median | min | max |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (size, read, cache), times in results.items():
        mb = sizes[size].stat().st_size / 1e6
        print(f"| {size} | {mb:.1f} MB | {read} | {cache} | {statistics.median(times):.3f}s | "
              f"{min(times):.3f}s | {max(times):.3f}s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
