"""Small deterministic GGUF models for a real llama.cpp server, written here (no weights
can be downloaded): a llama architecture with random weights from a seed derived from the
model's name, so two members are told apart by their answers, and a SentencePiece-style
vocabulary of control tokens, the 256 byte tokens (any UTF-8 input tokenizes), printable
ASCII and some whole words, with a ChatML chat template.

The output rows of control and non-ASCII byte tokens are zero, so generation never emits
end-of-sequence or broken UTF-8 and runs to `max_tokens`. The same name and size give the
same file, byte for byte.

    python -m e2e.llama.models DIR NAME [--size SIZE]   # prints the file's path

`tiny` is well under a megabyte and loads in tens of milliseconds; `large` is a few hundred
megabytes of random weights, for load times like a real swap's. The sizes named in
megabytes or gigabytes are about that large: those of benchmarks/gpu/ (tens of megabytes
for its dry run on CPUs, 2, 8 and 20 GB for a GPU's memory).
"""

from __future__ import annotations

import argparse
import hashlib
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = ("the", "pool", "shares", "one", "GPU", "between", "several", "models", "hello",
         "swap", "load", "model", "server", "a", "is", "of", "and", "to", "in", "it")
SPACE = "\u2581"  # SentencePiece's word boundary

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class Size:
    layers: int
    embedding: int
    heads: int
    feed_forward: int


SIZES = {
    "tiny": Size(layers=2, embedding=64, heads=4, feed_forward=128),
    "large": Size(layers=4, embedding=1024, heads=8, feed_forward=4096),
    # about 1 GB: a load that reads from disk for a second or more (benchmarks/bench_prewarm.py)
    "xlarge": Size(layers=16, embedding=1024, heads=8, feed_forward=4096),
    # benchmarks/gpu/: a layer of 512 is 17 MB, of 2048 268 MB, of 4096 1.07 GB (float32)
    "16mb": Size(layers=1, embedding=512, heads=8, feed_forward=2048),
    "32mb": Size(layers=2, embedding=512, heads=8, feed_forward=2048),
    "64mb": Size(layers=4, embedding=512, heads=8, feed_forward=2048),
    "2gb": Size(layers=8, embedding=2048, heads=16, feed_forward=8192),
    "8gb": Size(layers=8, embedding=4096, heads=32, feed_forward=16384),
    "20gb": Size(layers=18, embedding=4096, heads=32, feed_forward=16384),
}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: control tokens, the byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces = [SPACE] + [c for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [SPACE + w for w in WORDS]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    # Longer pieces score higher, so whole words win over their letters.
    scores = [0.0] * (5 + 256) + [float(len(p)) for p in pieces]
    return tokens, scores, types


def _seed(name: str, size: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{name}/{size}".encode()).digest()[:8], "big")


def write_model(directory: Path, name: str, size: str = "tiny") -> Path:
    """Write `<directory>/<name>.gguf` (if it is not there already) and return its path."""
    shape = SIZES[size]
    path = directory / (f"{name}.gguf" if size == "tiny" else f"{name}-{size}.gguf")
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(_seed(name, size))
    emb, ff, vocab = shape.embedding, shape.feed_forward, len(tokens)

    def weights(rows: int, cols: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        scaled: np.ndarray[Any, np.dtype[np.float32]] = (
            rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols)))
        return scaled

    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(name)
    writer.add_context_length(2048)
    writer.add_embedding_length(emb)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(emb // shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHATML)

    writer.add_tensor("token_embd.weight", weights(vocab, emb))
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(emb, dtype=np.float32))
        for part in ("q", "k", "v", "output"):
            writer.add_tensor(f"blk.{i}.attn_{part}.weight", weights(emb, emb))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(emb, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(ff, emb))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(ff, emb))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(emb, ff))
    writer.add_tensor("output_norm.weight", np.ones(emb, dtype=np.float32))
    output = weights(vocab, emb)
    # Never end, never emit a control token or half a UTF-8 character.
    silent = [i for i, t in enumerate(types) if t in (UNKNOWN, CONTROL)]
    silent += [i for i, t in enumerate(tokens) if types[i] == BYTE and int(t[3:5], 16) >= 0x80]
    silent += [i for i, t in enumerate(tokens) if types[i] == BYTE and int(t[3:5], 16) < 0x20]
    output[silent] = 0.0
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.llama.models",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("name")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    print(write_model(args.directory, args.name, args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
