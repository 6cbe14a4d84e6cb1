"""The instructor's toolkit, never shipped: labs from solutions, grading, the gradebook, the release, the transfer check."""
