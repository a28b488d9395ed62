"""A fake LLM model server that behaves, on the wire, like the runtimes modelpool shares a
GPU between, so every test and the local testbed can run without a GPU or weights.

Run it as ``python -m e2e.fake_model`` (console script ``modelpool-fake-model``). It follows
docs/contracts.md section 4:

- ``--mode {openai,llamacpp,vllm}`` (default ``openai``); llamacpp mode adds ``/slots``
  (one entry per slot, ``is_processing`` true while a request holds it).
- ``--host`` (default 0.0.0.0; ``MODELPOOL_BIND_HOST`` wins when set), ``--port`` (8080).
- ``--model`` / ``-m``: the served id is the basename without a weight-file extension
  (``/models/qwen.gguf`` serves ``qwen``), unless ``--served-model-name`` or ``--alias``
  / ``-a`` names it. vLLM's positional form (``serve MODEL`` or a leading ``MODEL``) works.
- ``--load-time`` seconds (default 0, env ``FAKE_MODEL_LOAD_TIME``): ``/health`` answers 503
  ``{"status": "loading"}`` and completions answer 503 until it has passed. It counts from
  the process's start (read from /proc), so the interpreter's own start-up is part of it
  and the server is ready ``load-time`` seconds after exec (or as soon as it listens, if
  that takes longer).
- ``--tokens-per-second`` (default 50, env ``FAKE_MODEL_TOKENS_PER_SECOND``): the pace of
  generated tokens, streamed or not.
- ``--max-tokens-default`` (16): tokens generated when a request gives no ``max_tokens``.
  Every reply is exactly ``max_tokens`` deterministic words, ``finish_reason: "length"``.
- ``--parallel`` / ``-np`` / ``--max-num-seqs`` (default 4): requests served at once; the
  rest wait for a slot and count as waiting.
- ``--fail-load`` or env ``FAKE_MODEL_FAIL_LOAD=1``: loading never finishes, so the server
  never turns healthy (used to test that a swap is abandoned at its budget).
- env ``FAKE_MODEL_UNLOAD_TIME`` seconds (or ``--unload-time``): after SIGTERM and the
  in-flight requests, wait this long before releasing the GPU lock and exiting, as a
  real server takes time to free its VRAM.
- ``PUT /fake/faults`` with ``{"idleProbe": "fail"}`` makes ``/slots`` and ``/metrics``
  answer 500 until ``{"idleProbe": "ok"}``: a fault switch for tests of the idle probe.
- GPU lock: when ``NVIDIA_VISIBLE_DEVICES`` lists devices (not empty, ``void`` or
  ``none``) and ``MODELPOOL_GPU_LOCK_DIR`` is set, loading begins by taking an exclusive,
  non-blocking ``flock`` on ``<dir>/gpu<id>.lock`` for each id. If one is held elsewhere
  the server logs ``GPU <id> is already in use`` and exits with code 3. A shared device
  (``MODELPOOL_GPU_MEMORY``, bytes) is charged instead: the server's footprint
  (``MODELPOOL_GPU_FOOTPRINT``, bytes, else ``--gpu-memory-utilization`` times the memory)
  goes to the device's ledger, and a load that would pass the memory logs ``GPU <id> out
  of memory`` and exits with code 3 (``gpu_ledger``).
- ``/metrics`` (Prometheus text): ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting`` in vllm mode, ``llamacpp:requests_processing`` and
  ``llamacpp:requests_deferred`` in llamacpp mode, ``fake_model_requests_running`` and
  ``fake_model_requests_waiting`` in openai mode.
- SIGTERM (or SIGINT): stop accepting connections, finish the requests in flight, wait the
  unload time, release the GPU lock, exit 0. Other exit codes: 2 bad settings, 3 GPU in
  use, 4 cannot bind.

Flags it does not know are accepted and ignored, so ``llama-server`` and vLLM command lines
pass unchanged. Responses name the served id as ``model`` whatever the request asked for,
so a test can tell which server answered.
"""

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The server (``cli.main``), imported only when run: ``gpu_lock`` and ``gpu_ledger``
    stay importable without the server's dependencies (e2e/llama/charged.py, in the
    llama-server image, charges the ledger with them)."""
    from e2e.fake_model.cli import main as serve_main

    return serve_main(argv)


__all__ = ["main"]
