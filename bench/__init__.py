"""Benchmarks: each module has ``main(argv) -> dict`` that prints a table and writes bench/results/NAME.json."""
