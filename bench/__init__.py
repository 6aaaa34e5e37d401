"""Load and latency benchmarks (not tests). See bench/README.md."""
