"""C microbenchmarks (built on demand) and the Python that runs them:
builds, sweeps, repetitions, statistics, result JSON."""
