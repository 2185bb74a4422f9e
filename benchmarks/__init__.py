"""Benchmark scripts that print tables; run each as `python benchmarks/<name>.py`."""
