"""Evaluation metrics and benchmarks."""
