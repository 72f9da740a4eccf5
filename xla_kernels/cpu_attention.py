"""Softmax attention as one XLA:CPU kernel (``model.attention_impl="cpu_flash"``, what ``"auto"`` picks on CPU): C++
through the XLA FFI (``cpu_attention.cc``), forward and backward, for dense attention (:func:`attention`) and for
WorldRoPE's per-view keys (:func:`per_view_attention`: query frame ``f`` sees the keys with their channel ``pairs``
rotated by its factors).

XLA:CPU runs the scores' product, the softmax and the values' product as separate ops, each streaming the
``[Lq, Lk]`` scores through memory. This kernel keeps each block of queries' score rows in cache from ``S = scale
q K^T`` to ``O = P v`` and saves the log-sum-exp per query; its backward recomputes ``P = exp(S - lse)`` and uses
``delta = rowsum(dO * O)`` (FlashAttention's backward, as ``xla_lse``). Both forms are one kernel: per-view, each
(batch, head, query frame)'s keys ``K`` are built in a per-thread buffer; dense attention rotates no pair.
Products by the BLAS ``sgemm`` that scipy ships (OpenBLAS, set to one thread for the whole process); the kernel
runs its units (forward: batch, head, query frame and block; backward: batch and head) on OpenMP threads
(``cpu_build.threads``).

Built with ``g++`` at first use (``cpu_build``). float32 only; a mask is a
token mask shared by the heads (broadcastable to ``[B, (1,) Lq, Lk]``; a frame mask is expanded); anything else is
refused with a ``ValueError`` naming the impl (:func:`unsupported` says why without raising).
"""

import ctypes
import functools
import pathlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

from xla_kernels import cpu_build
from xla_kernels.cpu_build import threads

IMPL = "cpu_flash"
SOURCE = pathlib.Path(__file__).with_suffix(".cc")
BLOCK_BYTES = 1 << 20  # a unit's block of query rows: their scores fit in 1 MiB of cache
MIN_BLOCK, MAX_BLOCK = 64, 256
BLOCK = None  # forced query rows per unit (benchmarks, tests); None: sized by the keys, block_rows


def block_rows(lk):
  """Query rows per unit for ``lk`` keys: the power of two in ``[MIN_BLOCK, MAX_BLOCK]`` whose ``rows x lk`` float32
  scores fit in ``BLOCK_BYTES`` (64 from 4,096 keys on), or ``BLOCK`` where set. Larger blocks mean fewer, larger
  ``sgemm`` calls: the tiny backbone step 4.6% faster with 256 rows than 64 at 960 keys (BENCHMARKS.md)."""
  if BLOCK:
    return int(BLOCK)
  rows = BLOCK_BYTES // (4 * max(int(lk), 1))
  return max(MIN_BLOCK, min(MAX_BLOCK, 1 << (max(rows, 1).bit_length() - 1)))


_lock = threading.Lock()
_loaded = []


def _fail(message):
  raise ValueError(f"model.attention_impl={IMPL!r}: {message}")


def library():
  """The loaded kernel library (built on first use), its FFI targets registered and its ``sgemm`` set."""
  with _lock:
    if _loaded:
      return _loaded[0]
    lib = cpu_build.shared_library(SOURCE, _fail)
    lib.jaxwm_cpu_attention_set_sgemm(ctypes.c_void_p(cpu_build.scipy_sgemm(IMPL)))
    cpu_build.register(lib, {"jaxwm_cpu_attention_fwd": "JaxwmCpuAttentionForward",
                             "jaxwm_cpu_attention_bwd": "JaxwmCpuAttentionBackward"})
    _loaded.append(lib)
    return lib


def _attrs(scale, mask, lk):
  return {"scale": np.float32(scale), "has_mask": np.int64(mask is not None), "block": np.int64(block_rows(lk)),
          "threads": np.int64(threads())}


def _call(target, out):
  return jax.ffi.ffi_call(target, out, vmap_method="sequential")  # under vmap: one call per element


def _mask_arg(mask):
  return jnp.zeros((1, 1, 1), jnp.uint8) if mask is None else mask


def _forward(q, k, v, fac, pairs, mask, scale):
  b, lq, h, _ = q.shape
  out = (jax.ShapeDtypeStruct((b, lq, h, v.shape[-1]), jnp.float32), jax.ShapeDtypeStruct((b, h, lq), jnp.float32))
  return _call("jaxwm_cpu_attention_fwd", out)(q, k, v, fac, np.asarray(pairs, np.int32), _mask_arg(mask),
                                                          **_attrs(scale, mask, k.shape[1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 6))
def _attention(q, k, v, fac, pairs, mask, scale):
  return _forward(q, k, v, fac, pairs, mask, scale)[0]


def _attention_fwd(q, k, v, fac, pairs, mask, scale):
  out, lse = _forward(q, k, v, fac, pairs, mask, scale)
  return out, (q, k, v, fac, mask, out, lse)


def _attention_bwd(pairs, scale, res, g):
  q, k, v, fac, mask, out, lse = res
  shapes = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (q, k, v, fac))
  grads = _call("jaxwm_cpu_attention_bwd", shapes)(q, k, v, fac, np.asarray(pairs, np.int32),
                                                              _mask_arg(mask), out, lse, g.astype(jnp.float32),
                                                              **_attrs(scale, mask, k.shape[1]))
  return (*grads, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _mask_shape(mask):
  """The token mask's shape (a frame mask's ``.shape`` without building it)."""
  return tuple(mask.shape) if hasattr(mask, "shape") else np.shape(mask)


def _mask_problem(shape, batch, lq, lk):
  """Why a mask of ``shape`` does not fit the kernel's ``[1 or B, Lq, Lk]`` (or None)."""
  if len(shape) == 4:
    if shape[1] != 1:
      return f"takes a mask shared by the heads; got per-head mask shape {shape}"
    shape = shape[:1] + shape[2:]
  shape = (1,) * (3 - len(shape)) + tuple(shape)
  if len(shape) != 3 or shape[0] not in (1, batch) or shape[1] not in (1, lq) or shape[2] not in (1, lk):
    return f"mask shape {shape} does not broadcast to [1 or {batch}, (1,) {lq}, {lk}]"
  return None


def token_mask(mask, batch, lq, lk):
  """``mask`` (bool, broadcastable to ``[B, (1,) Lq, Lk]``, or a frame mask with ``.tokens()``) as the kernel's
  ``uint8 [1 or B, Lq, Lk]``; None stays None. A per-head mask or another shape is refused (``ValueError``)."""
  if mask is None:
    return None
  if isinstance(mask, jax.Array) and mask.dtype == jnp.uint8 and mask.ndim == 3 and mask.shape[1:] == (lq, lk) \
      and mask.shape[0] in (1, batch):
    return mask  # already the kernel's (jaxwm.kernels converts it before its shard map)
  problem = _mask_problem(_mask_shape(mask), batch, lq, lk)
  if problem:
    _fail(problem)
  if hasattr(mask, "tokens") and not isinstance(mask, jax.Array):
    mask = mask.tokens()
  mask = jnp.asarray(mask)
  if mask.ndim == 4:
    mask = mask[:, 0]
  mask = mask.reshape((1,) * (3 - mask.ndim) + mask.shape)
  return jnp.broadcast_to(mask, (mask.shape[0], lq, lk)).astype(bool).astype(jnp.uint8)  # nonzero: attend


_unavailable = []  # why the kernel could not be built or loaded here (once)
_probe_lock = threading.Lock()


def unsupported(arrays, mask=None):
  """Why this kernel cannot take ``arrays`` (``q, k, v``, and the factors) under ``mask`` (an array or frame mask,
  or None), or None when it can: ``model.attention_impl="auto"`` picks it on CPU only then. A kernel that cannot be
  built or loaded here (no C++ compiler, a read-only cache, another OS) is a reason too, found once and logged as a
  warning."""
  for a in arrays:
    if a.dtype != jnp.float32:
      return f"float32 only, an input is {jnp.dtype(a.dtype).name}"
  if mask is not None:
    q, k = arrays[0], arrays[1]
    problem = _mask_problem(_mask_shape(mask), q.shape[0], q.shape[1], k.shape[1])
    if problem:
      return problem
  return cpu_build.unavailable(library, _loaded, _unavailable, _probe_lock,
                               "model.attention_impl='auto' uses 'xla_lse' on CPU: the cpu_flash kernel is unavailable "
                               "here (%s)")


def _check_float32(**arrays):
  for name, a in arrays.items():
    if a.dtype != jnp.float32:
      _fail(f"is float32 only; {name} is {a.dtype}")


def attention(q, k, v, mask=None, *, scale=None):
  """Dense attention, ``jaxwm.ops.attention.dot_product_attention``'s signature and result, on XLA:CPU.

  ``q [B, Lq, H, D]``, ``k, v [B, Lk, H, D]`` float32; ``mask`` as :func:`token_mask` (True = attend). Returns
  ``[B, Lq, H, D]`` float32; gradients w.r.t. ``q, k, v``. A query with no key to attend to gets 0.
  """
  _check_float32(q=q, k=k, v=v)
  if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
    _fail(f"q {q.shape}, k {k.shape}, v {v.shape} are not [B, Lq, H, D], [B, Lk, H, D], [B, Lk, H, D]")
  library()
  scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
  mask = token_mask(mask, q.shape[0], q.shape[1], k.shape[1])
  return _attention(q, k, v, jnp.zeros((1, 1, 1, 0, 2), jnp.float32), (), mask, scale)  # no pairs rotated


def per_view_attention(q, k, v, factors, pairs, mask=None, *, scale):
  """Attention whose keys depend on the query frame (WorldRoPE), ``jaxwm.ops.attention.per_view_attention``'s
  signature and result, on XLA:CPU: each query frame's keys are rotated inside the kernel, never materialised.

  ``q [B, F N, H, D]``, ``k [B, Lk, H, D]``, ``v [B, Lk, H, Dv]``, ``factors [B, F, Lk, P, 2]`` float32; ``pairs``
  the ``P`` channel pairs the factors rotate (static ints, pair ``c`` is channels ``2c, 2c + 1``); ``mask`` as
  :func:`token_mask`. Returns ``[B, F N, H, Dv]`` float32; gradients w.r.t. ``q, k, v, factors``. A query with no
  key to attend to gets 0.
  """
  _check_float32(q=q, k=k, v=v, factors=factors)
  pairs = tuple(int(c) for c in pairs)
  b, lq, h, d = q.shape
  f, lk = factors.shape[1], k.shape[1]
  want = ((b, lk, h, d), (b, lk, h), (b, f, lk, len(pairs), 2))
  if (k.shape, v.shape[:3], factors.shape) != want or f == 0 or lq % f:
    _fail(f"per-view shapes q {q.shape}, k {k.shape}, v {v.shape}, factors {factors.shape} are not [B, F N, H, D], "
          f"[B, Lk, H, D], [B, Lk, H, Dv], [B, F, Lk, P, 2] with P = {len(pairs)} pairs")
  if not pairs or len(set(pairs)) < len(pairs) or min(pairs) < 0 or max(pairs) >= d // 2:
    _fail(f"pairs {pairs} must be distinct channel pairs of head_dim {d} (0 <= pair < {d // 2}), at least one")
  library()
  return _attention(q, k, v, factors, pairs, token_mask(mask, b, lq, lk), float(scale))
