"""The measurements the `bench_*` commands make: timing and statistics (`support`), and one module per
benchmark whose functions run a measurement and return its figures as a dict. The commands in
`experiments/bench_*.py` keep the command line, the tables, and the sections written to BENCHMARKS.md."""
