module modelpool.dev/benchmarks/streamload

go 1.26
