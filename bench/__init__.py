"""turnkeeper's benchmarks (``make bench``); never part of ``make test``."""
