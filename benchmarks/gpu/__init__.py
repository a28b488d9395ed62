"""One command that measures a real llama-server on an NVIDIA card (swaps, memory-budget
pools, KV slot save and restore), and its dry run on CPUs: `benchmarks/gpu/run.sh`."""
