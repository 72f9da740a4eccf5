"""Kernels written in ``jnp`` for XLA backends (the CPU above all): the same maths as a ``jaxwm/ops`` reference with
a hand-written backward that keeps less, chosen by ``impl=`` in ``jaxwm.kernels`` like the Pallas kernels (never
a silent fallback). Kernels import only public helpers of ``jaxwm``, never the references they are tested against.

- ``softmax_attention.py``: softmax attention (dense, or any logits function such as WorldRoPE's per-view keys;
  ``jaxwm.ops.attention``) whose backward keeps the log-sum-exp per query instead of the ``[Lq, Lk]``
  probabilities (``model.attention_impl='xla_lse'``).
- ``cpu_attention.py`` + ``cpu_attention.cc``: softmax attention, dense and with WorldRoPE's per-view keys (each
  query frame's keys rotated inside the kernel), as one C++ kernel for XLA:CPU through the XLA FFI, forward and
  backward, built with g++ at first use (``model.attention_impl='cpu_flash'``; ``'auto'`` on CPU).
- ``cpu_view_factors.py`` + ``cpu_view_factors.cc``: WorldRoPE's expected rotary factors (``jaxwm.ops.view_factors``)
  as one C++ kernel, forward and backward (every input's gradient), with ``cpu_flash`` and ``auto`` on CPU.
- ``cpu_delta_rule.py`` + ``cpu_delta_rule.cc``: the chunked gated delta rule (``jaxwm.ops.delta_rule``) as one C++
  kernel, forward and backward (``model.loci.impl='cpu_flash'``).
- ``cpu_build.py`` builds and loads the C++ kernels; ``cpu_math.h`` holds the ``exp`` and ``sincos`` they share,
  ``cpu_ffi.h`` their FFI binding helpers, ``cpu_blas.h`` the BLAS ``sgemm`` they multiply with.
"""
