"""Benchmarks that print comparison tables; run as `python -m bench.<name>` from the repository root."""
