"""Benchmarks: each module has ``main(quick=False, results_dir=...) -> dict`` that prints a table and
writes bench/results/NAME.json (``trickle bench NAME``)."""
