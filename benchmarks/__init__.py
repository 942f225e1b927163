"""The project's benchmarks, apart from the installed package (the wheel ships none of them): one module per
benchmark, its config, measurement and report together, run from the repository's root as
`python -m benchmarks.NAME [--field value ...] [--json PATH] [--docs docs/BENCHMARKS.md]`; `python -m benchmarks`
lists them. They import `capsule_rollout`; nothing in it imports them. README.md says what each measures."""
