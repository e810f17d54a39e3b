"""Developer tools (benchmarks and scripts); not part of the runtime package."""
