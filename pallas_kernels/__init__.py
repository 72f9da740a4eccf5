"""Pallas kernels for TPU and GPU, one folder per operator, each sharing the signature of its
pure-``jnp`` reference in ``jaxwm/ops`` and chosen by ``impl=`` in ``jaxwm.kernels`` (never a
silent fallback). Kernels import only public helpers of ``jaxwm``; ``jaxwm.ops`` imports no kernel.

- ``frame_sparse_attention/``: ViewRope's gathered frame-sparse attention (``jaxwm.ops.frame_sparse``).
- ``delta_rule/``: the chunked gated delta rule (``jaxwm.ops.delta_rule``).
- ``splash_attention.py``: dense attention with a token mask (``jaxwm.ops.attention``) through jax's
  TPU splash attention kernel (a wrapper: padding, static or traced masks, ``interpret``).

Each has a TPU (Mosaic) and a GPU (Triton) kernel with forward and backward passes in a
``custom_vjp``; ``interpret=True`` runs them on CPU (how the tests check them).
"""
