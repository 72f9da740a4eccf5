"""The chunked gated delta rule (KDA / Gated DeltaNet; ``jaxwm.ops.delta_rule.delta_rule_chunked``) as one C++ kernel
for XLA:CPU (``cpu_delta_rule.cc``), forward and backward (``model.loci.impl="cpu_flash"``).

XLA:CPU runs the chunked form as a scan whose steps are small batched products (16 x 16 and 16 x 128 per head) and
pairwise decays, each a separate op streaming its tensor through memory: 10-15x its matmul FLOP floor. This kernel
walks the chunks of each (batch, head) with the state in cache, reading the reference's ``[B, T, H, K]`` layout in
place; per chunk it forms the cumulative decay, the pairwise decayed products and the two triangular solves in
vectorised loops and the four state products by the BLAS ``sgemm`` scipy ships. The forward saves each chunk's
incoming state when a gradient is taken; the backward walks the chunks in reverse from them (the derivation of
``pallas_kernels.delta_rule.chunk_math.chunk_backward``) and returns every input's gradient, the raw log-decay's
included. Input checks and preparation are the op's interface (``jaxwm.interfaces.delta_rule``), shared with the
reference.

Built with ``g++`` at first use (``cpu_build``); float32 inside (inputs are cast as by the reference). ``g`` is a
log-decay, ``<= 0``: only exponentials of non-positive numbers are taken, a positive cumulative difference is clamped
to 0 (so ``g > 0``, outside the op's domain, does not give the reference's result), and a NaN reaches the outputs.
Reverse-mode differentiation only (``custom_vjp``, as the Pallas kernels): ``jax.jvp`` of it raises.
"""

import ctypes
import functools
import operator
import threading

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.interfaces.delta_rule import pad_time, prepare_inputs
from xla_kernels import cpu_build
from xla_kernels.cpu_build import threads

IMPL = "cpu_flash"
SOURCE = cpu_build.HERE / "cpu_delta_rule.cc"
_lock = threading.Lock()
_loaded = []


def _fail(message):
  raise ValueError(f"model.loci.impl={IMPL!r} (the delta rule): {message}")


def library():
  """The loaded kernel library (built on first use), its FFI targets registered and its ``sgemm`` set."""
  with _lock:
    if not _loaded:
      lib = cpu_build.shared_library(SOURCE, _fail)
      lib.jaxwm_cpu_delta_rule_set_sgemm(ctypes.c_void_p(cpu_build.scipy_sgemm(IMPL)))
      cpu_build.register(lib, {"jaxwm_cpu_delta_rule_fwd": "JaxwmCpuDeltaRuleForward",
                               "jaxwm_cpu_delta_rule_bwd": "JaxwmCpuDeltaRuleBackward"})
      _loaded.append(lib)
    return _loaded[0]


def _call(target, out):
  return jax.ffi.ffi_call(target, out, vmap_method="sequential")


def _f32(*shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _forward(q, k, v, g, beta, s0, scale, chunk, save_states):
  """``(o [B, T, H, V], states [B, H, N, K, V] (N = 0 unless save_states), s_final [B, H, K, V])``."""
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  out = (_f32(b, t, h, dv), _f32(b, h, t // chunk if save_states else 0, dk, dv), _f32(b, h, dk, dv))
  return _call("jaxwm_cpu_delta_rule_fwd", out)(q, k, v, g, beta, s0, scale=np.float32(scale), chunk=np.int64(chunk),
                                                 save_states=np.int64(save_states), threads=np.int64(threads()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _scan(q, k, v, g, beta, s0, scale, chunk):
  o, _, s = _forward(q, k, v, g, beta, s0, scale, chunk, False)
  return o, s


def _scan_fwd(q, k, v, g, beta, s0, scale, chunk):  # the ffi_call itself, seen by remat policies
  o, states, s = _forward(q, k, v, g, beta, s0, scale, chunk, True)
  return (o, s), (q, k, v, g, beta, states)


def _scan_bwd(scale, chunk, res, cot):
  do, ds = (c.astype(jnp.float32) for c in cot)
  out = tuple(_f32(*a.shape) for a in res[:5]) + (_f32(*ds.shape),)
  return _call("jaxwm_cpu_delta_rule_bwd", out)(*res, do, ds, scale=np.float32(scale), chunk=np.int64(chunk),
                                                 threads=np.int64(threads()))


_scan.defvjp(_scan_fwd, _scan_bwd)


def delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
               interpret=False):
  """``jaxwm.ops.delta_rule.delta_rule_chunked``'s contract on XLA:CPU (``interpret`` is accepted and ignored: the
  kernel is native code): ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g [B, T, H(, K)]``, ``beta [B, T, H]``,
  ``initial_state [B, H, K, V]`` -> ``(o [B, T, H, V] in v's dtype, final_state or None)``; gradients w.r.t. every
  input. ``T`` is padded to whole chunks with ``beta = 0``, ``g = 0`` (no-op tokens) as by the reference."""
  del interpret
  try:
    chunk = operator.index(chunk_size) if not isinstance(chunk_size, bool) else 0
  except TypeError:
    chunk = 0
  if chunk < 1:
    _fail(f"chunk_size={chunk_size!r}: must be a positive int")
  dtype = v.dtype
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  traced = isinstance(scale, jax.core.Tracer) or np.ndim(scale)
  # a number: the kernel scales q (and dq); an array (traced, learnt): JAX scales q and differentiates through it
  q, k, v, g, beta, s0 = prepare_inputs(q, k, v, g, beta, scale if traced else 1.0, initial_state)
  scale = 1.0 if traced else float(scale)
  library()
  t = q.shape[1]
  pad = (-t) % chunk
  q, k, v, g, beta = (pad_time(x, pad) for x in (q, k, v, g, beta))
  o, s = _scan(q, k, v, g, beta, s0, scale, chunk)
  return o[:, :t].astype(dtype), (s if output_final_state else None)


_unavailable = []
_probe_lock = threading.Lock()


def unavailable():
  """Why this kernel cannot be built or loaded here, or None (``cpu_build.unavailable``: found once, logged as a
  warning)."""
  return cpu_build.unavailable(library, _loaded, _unavailable, _probe_lock,
                               "model.loci.impl='cpu_flash': the delta rule's C++ kernel is unavailable here (%s)")
