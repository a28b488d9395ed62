"""`modelpool/llama-server` on the local testbed: the real llama-server in place of the
image's `/app/llama-server`, with the image's generated models.

The node agent runs `python -m e2e.llama.serve ARGS` for that image (no container runtime
there), ARGS being what the container would get. This finds the binary that
`e2e/llama/build-llama-server.sh` built (it never builds here: the README's test command
does), gives a `--model /models/NAME.gguf` the file the image carries under that name (the
same generator writes it into the cache on first use: `NAME-large.gguf` the large size,
anything else the tiny one), and a model path that does not exist here (weights a real
GPU node would have pre-staged, such as examples/' gemma) a tiny generated stand-in of the
same name, saying so; binds to the pod's address the node agent hands out
(`MODELPOOL_BIND_HOST`) in place of `--host`, and then becomes llama-server (exec).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.llama import models

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "e2e" / "llama" / "build-llama-server.sh"
IMAGE_MODELS = "/models/"


def user_home() -> str:
    """The user's own home: a pod's HOME is the container's (/home/modelpool), not theirs."""
    return pwd.getpwuid(os.getuid()).pw_dir


def cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("MODELPOOL_CACHE") or str(
        Path(env.get("XDG_CACHE_HOME") or Path(user_home()) / ".cache") / "modelpool")
    return Path(base) / "llama" / "models"


def image_model(path: str, directory: Path) -> Path:
    """The generated file standing in for the image's `/models/<file>`."""
    stem = Path(path).name.removesuffix(".gguf")
    if stem.endswith("-large"):
        return models.write_model(directory, stem.removesuffix("-large"), "large")
    return models.write_model(directory, stem)


def server_args(args: Sequence[str], directory: Path, bind_host: str | None) -> list[str]:
    """ARGS with the image's model paths and the bind address made local."""
    out: list[str] = []
    words = iter(args)
    for word in words:
        if word in ("--model", "-m", "--host"):
            value = next(words, "")
            if word == "--host" and bind_host:
                value = bind_host
            elif word != "--host" and value.startswith(IMAGE_MODELS):
                value = str(image_model(value, directory))
            elif word != "--host" and not Path(value).exists():
                stand_in = image_model(value, directory)
                print(f"e2e.llama.serve: {value} is not on this machine: serving a generated "
                      f"stand-in, {stand_in}", file=sys.stderr)
                value = str(stand_in)
            out += [word, value]
        else:
            out.append(word)
    if bind_host and "--host" not in out:
        out += ["--host", bind_host]
    return out


def binary() -> str:
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False,
                            env={**os.environ, "HOME": user_home(),
                                 "MODELPOOL_LLAMA_NO_BUILD": "1"})
    if result.returncode != 0:
        raise SystemExit(f"e2e.llama.serve: no llama-server built; run {BUILD} first "
                         f"(the README's test command does): {result.stderr.strip()}")
    return result.stdout.strip().splitlines()[-1]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    program = binary()
    final = server_args(args, cache_dir(os.environ), os.environ.get("MODELPOOL_BIND_HOST"))
    os.execv(program, [program, *final])


if __name__ == "__main__":
    main()
