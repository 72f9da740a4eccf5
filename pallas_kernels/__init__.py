"""Pallas kernels for TPU and GPU, one folder per operator, each sharing the signature of its
pure-``jnp`` reference in ``jaxwm/ops`` and chosen by ``impl=`` (never a silent fallback).

No kernel has landed yet: frame-sparse attention and the chunked delta rule come with their issues.
"""
