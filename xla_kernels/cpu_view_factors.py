"""WorldRoPE's expected rotary factors as one C++ kernel for XLA:CPU (``cpu_view_factors.cc``), forward and backward
(``model.attention_impl="cpu_flash"``, what ``"auto"`` picks on CPU, runs WorldRoPE's factors here too).

Every key's depth Gaussians are projected into every query camera and, per channel pair, turned into
``sum_m alpha_m exp(i w . mu'_m - w^T Sigma'_m w / 2)`` (docs/design.md §4). XLA:CPU ran this as dozens of ops over
``[B, F, Lk, M, P]`` arrays (batched 3x3 dots, a slow reduction over hypotheses, and the same again backward); here
each (view, key, hypothesis) is projected once in registers and its pairs are summed in one vectorised loop. The
backward returns every input's gradient, the query cameras' included. float32 only; built with ``g++`` at first use
(``cpu_build``).
"""

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels import cpu_build
from xla_kernels.cpu_build import threads

IMPL = "cpu_flash"
SOURCE = cpu_build.HERE / "cpu_view_factors.cc"
EPS = 1e-6  # a hypothesis is in front of the query camera where its depth there exceeds EPS
_lock = threading.Lock()
_loaded = []


def _fail(message):
  raise ValueError(f"model.attention_impl={IMPL!r} (WorldRoPE's factors): {message}")


def library():
  """The loaded kernel library (built on first use), its FFI targets registered."""
  with _lock:
    if not _loaded:
      lib = cpu_build.shared_library(SOURCE, _fail)
      cpu_build.register(lib, {"jaxwm_cpu_view_factors_fwd": "JaxwmCpuViewFactorsForward",
                               "jaxwm_cpu_view_factors_bwd": "JaxwmCpuViewFactorsBackward"})
      _loaded.append(lib)
    return _loaded[0]


def _attrs(pixels_per_token):
  return {"inv_s": np.float32(1.0 / pixels_per_token), "eps": np.float32(EPS), "threads": np.int64(threads())}


def _call(target, out):
  return jax.ffi.ffi_call(target, out, vmap_method="sequential")


def _forward(mean, root, alpha, q_k, q_c2w, freqs, pixels):
  b, lk = alpha.shape[:2]
  out = jax.ShapeDtypeStruct((b, q_c2w.shape[1], lk, len(freqs), 2), jnp.float32)
  return _call("jaxwm_cpu_view_factors_fwd", out)(mean, root, alpha, q_k, q_c2w, np.asarray(freqs, np.float32),
                                                  **_attrs(pixels))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _factors(mean, root, alpha, q_k, q_c2w, freqs, pixels):
  return _forward(mean, root, alpha, q_k, q_c2w, freqs, pixels)


def _factors_fwd(mean, root, alpha, q_k, q_c2w, freqs, pixels):  # the ffi_call itself, seen by remat policies
  return _forward(mean, root, alpha, q_k, q_c2w, freqs, pixels), (mean, root, alpha, q_k, q_c2w)


def _factors_bwd(freqs, pixels, res, g):
  shapes = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in res)
  return _call("jaxwm_cpu_view_factors_bwd", shapes)(*res, np.asarray(freqs, np.float32), g.astype(jnp.float32),
                                                     **_attrs(pixels))


_factors.defvjp(_factors_fwd, _factors_bwd)


def view_factors(gauss, q_intrinsics, q_c2w, freqs, pixels_per_token):
  """``jaxwm.ops.view_factors.view_factors``' signature and result, on XLA:CPU: ``factors [B, Fq, Lk, P, 2]``
  float32 of the key Gaussians ``gauss`` (``mean [B, Lk, M, 3]``, ``root [B, Lk, M, 3, 3]``, ``alpha [B, Lk, M]``)
  in the query cameras ``q_intrinsics [B, Fq, 3, 3]``, ``q_c2w [B, Fq, 4, 4]`` at the static frequencies
  ``freqs [P, 2]``; gradients w.r.t. the Gaussians and the cameras. Other dtypes or shapes: ``ValueError``."""
  mean, root, alpha = gauss["mean"], gauss["root"], gauss["alpha"]
  for name, a in (("mean", mean), ("root", root), ("alpha", alpha), ("q_intrinsics", q_intrinsics),
                  ("q_c2w", q_c2w)):
    if a.dtype != jnp.float32:
      _fail(f"is float32 only; {name} is {a.dtype}")
  b, lk, m = alpha.shape if alpha.ndim == 3 else (None,) * 3
  f = q_c2w.shape[1] if q_c2w.ndim == 4 else None
  if isinstance(freqs, jax.core.Tracer) or np.ndim(freqs) != 2 or np.shape(freqs)[-1] != 2:
    _fail(f"freqs must be static [P, 2] frequencies (NumPy); got {type(freqs).__name__} of shape {np.shape(freqs)}")
  if not np.isfinite(pixels_per_token) or pixels_per_token <= 0:
    _fail(f"pixels_per_token={pixels_per_token!r}: must be a positive number")
  freqs = tuple((float(u), float(v)) for u, v in np.asarray(freqs, np.float32))
  if (mean.shape, root.shape, q_intrinsics.shape, q_c2w.shape) != ((b, lk, m, 3), (b, lk, m, 3, 3), (b, f, 3, 3),
                                                                   (b, f, 4, 4)) or not freqs:
    _fail(f"shapes mean {mean.shape}, root {root.shape}, alpha {alpha.shape}, q_intrinsics {q_intrinsics.shape}, "
          f"q_c2w {q_c2w.shape}, {len(freqs)} frequencies are not [B, Lk, M, 3], [B, Lk, M, 3, 3], [B, Lk, M], "
          "[B, F, 3, 3], [B, F, 4, 4] and at least one")
  library()
  return _factors(mean, root, alpha, q_intrinsics, q_c2w, freqs, float(pixels_per_token))


_unavailable = []
_probe_lock = threading.Lock()


def unavailable():
  """Why this kernel cannot be built or loaded here, or None (``cpu_build.unavailable``: found once, logged as a
  warning); ``model.attention_impl="auto"`` then computes WorldRoPE's factors with the ``jnp`` reference."""
  return cpu_build.unavailable(library, _loaded, _unavailable, _probe_lock,
                               "model.attention_impl='auto': WorldRoPE's factors use the jnp reference on CPU: the C++ "
                               "kernel is unavailable here (%s)")
