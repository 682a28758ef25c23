"""Fast unit tests: no cluster, no training processes, no install step (`pytest tests/core`)."""
