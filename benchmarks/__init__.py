"""Benchmarks of the template against a hand-written DDP program (``python -m benchmarks.run``)."""
