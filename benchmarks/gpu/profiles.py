"""What the GPU script measures on each kind of machine: the models, the contexts and the
server's arguments. `gpu` is the real run on an NVIDIA card; `cpu` its dry run on the CPU
build, the same steps on models of tens of megabytes and contexts of hundreds of tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    # e2e/llama/models.py sizes, smallest first: loaded one by one, swapped between, and
    # the first two, then all three, resident at once
    sizes: tuple[str, str, str]
    load_context: int  # the context of every server but the KV step's
    kv_size: str  # the model whose slot is saved and restored
    kv_contexts: tuple[int, ...]  # prompt lengths (tokens) saved, restored and re-prefilled
    server_args: tuple[str, ...]
    nvidia: bool  # memory from nvidia-smi (else /proc RSS)
    drop_all: bool  # a cold cache drops every clean page as root, not only the model's
    ready_timeout_s: float

    @property
    def kv_server_context(self) -> int:
        """Room for the longest prompt, the continuation after a restore and its answer."""
        return max(self.kv_contexts) + 256


# One slot, so a slot's cache is the whole context; no host-memory prompt cache (it would
# answer a re-prefill from RAM and hide what a restore saves).
COMMON = ("-np", "1", "--cache-ram", "0")

PROFILES = {
    "gpu": Profile(
        name="gpu", sizes=("2gb", "8gb", "20gb"), load_context=4096, kv_size="2gb",
        kv_contexts=(4096, 16384, 32768),
        # every layer on the card, and no fitting of the context to free memory: a pool
        # declares what each member takes
        server_args=(*COMMON, "-ngl", "all", "--fit", "off"),
        nvidia=True, drop_all=True, ready_timeout_s=300),
    "cpu": Profile(
        name="cpu", sizes=("16mb", "32mb", "64mb"), load_context=1024, kv_size="16mb",
        kv_contexts=(256, 512, 1024), server_args=COMMON,
        nvidia=False, drop_all=False, ready_timeout_s=60),
}
