"""Tendon's benchmark harness: Tendon against the physical floor and its peers, in one run.

Entry point: ``python -m bench run [--quick] [--out DIR]`` (see docs/benchmarks/README.md).
"""
