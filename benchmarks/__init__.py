"""Benchmark scripts that print tables; each module docstring says how to run it."""
