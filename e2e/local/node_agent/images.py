"""Which local program stands in for which container image.

No container runtime runs on the testbed, so an image names a program of this project
that the node agent runs with the testbed's own interpreter. Only the image's repository
counts: the registry, the tag and the digest are ignored, so the manifests written for a
real cluster (`ghcr.io/ggml-org/llama.cpp:server-cuda`) run here unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

# Image repository -> the interpreter arguments that start its stand-in.
PROGRAMS: Mapping[str, tuple[str, ...]] = {
    "modelpool/fake-model": ("-m", "e2e.fake_model"),
    # llama.cpp's own image stays the fake: the README's first command (the demo of
    # examples/) then needs no C++ build. The project's llama-server image is the real one
    # (e2e/llama/serve.py), as on kind: overlays/examples-testbed uses it.
    "ggml-org/llama.cpp": ("-m", "e2e.fake_model", "--mode", "llamacpp"),
    "modelpool/llama-server": ("-m", "e2e.llama.serve"),
    "vllm/vllm-openai": ("-m", "e2e.fake_model", "--mode", "vllm"),
    # The product's image: its entrypoint is the reconciler (PRODUCT_COMMANDS: the router).
    "modelpool/modelpool": ("-m", "reconciler"),
    "modelpool/router": ("-m", "sidecar"),
    "modelpool/reconciler": ("-m", "reconciler"),
    # Test-only: lists or gets an object kind with the pod's own credentials.
    "modelpool/testbed-client": ("-m", "e2e.local.node_agent.client"),
}


def image_repository(image: str) -> str:
    """`registry.example:5000/org/name:tag@sha256:...` -> `org/name`."""
    name = image.split("@", 1)[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "library":
        parts = parts[1:]
    return "/".join(parts)


# The product's commands: a container whose command names one runs that program, whichever
# image it names (the router is the product's image with the command modelpool-router).
PRODUCT_COMMANDS: Mapping[str, tuple[str, ...]] = {
    "modelpool-reconciler": ("-m", "reconciler"),
    "modelpool-router": ("-m", "sidecar"),
    "modelpool-kv-clean": ("-m", "reconciler.kv_clean"),
    "modelpool-kv-files": ("-m", "reconciler.kv_files"),
}


def program_for(image: str, command: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The interpreter arguments for a container's image and command, or None when no
    program stands in for it."""
    if command and PurePosixPath(command[0]).name in PRODUCT_COMMANDS:
        return PRODUCT_COMMANDS[PurePosixPath(command[0]).name]
    return PROGRAMS.get(image_repository(image))
