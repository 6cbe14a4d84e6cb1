"""Maintainer and CI tooling, never shipped: notebook tests, committed outputs, `make solutions`, benchmarks run together, soak."""
