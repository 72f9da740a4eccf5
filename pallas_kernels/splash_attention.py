"""Dense attention with a token mask through jax's TPU splash attention
(``jax.experimental.pallas.ops.tpu.splash_attention``): a flash-style Mosaic kernel that skips
fully masked ``(query block, key block)`` pairs and never materialises the ``[H, Lq, Lk]`` scores.

Same contract as ``jaxwm.ops.attention.dot_product_attention`` (``q [B, Lq, H, D]``, ``k, v
[B, Lk, H, D]``, bool mask ``[Bm, (Hm,) Lq, Lk]`` with ``Bm`` in ``{1, B}`` and ``Hm`` in ``{1, H}``,
True = attend) plus ``block`` and ``interpret``. The mask may be

- ``None``: splash's ``FullMask``;
- a NumPy array shared by the batch: static (``NumpyMask``): only the distinct partial blocks are
  kept and the block-sparsity tables are built on the host once;
- ``frame_mask=(frames, n)`` instead of ``mask``: a static frame-level NumPy mask ``[Sq, Sk]`` of frames of
  ``n`` tokens (a layout's mask known at trace time): its token blocks are computed on the host one block at
  a time (:class:`FrameTokenMask`) and only the distinct partial blocks reach the device, so nothing of size
  ``[Lq, Lk]`` exists anywhere;
- a ``jax.Array`` (what a traced model has, e.g. the teacher-forcing layout's frame mask expanded to
  tokens, with chunk drop or per-head windows): splash's dynamic mask, whose tables are computed on
  device from the mask and whose partial blocks are the (padded) mask itself.

Sequences are padded to a multiple of the block: padded keys are masked out (by the mask, or
by segment ids for ``FullMask``), padded query rows attend to every real key and are sliced off.
Splash takes no scale: ``q`` is multiplied by ``scale`` first. ``interpret=True`` runs it on CPU with
Pallas' generic interpreter (the TPU interpreter, ``pltpu.InterpretParams``, refuses the batch
``vmap``: its grid gains a dimension its dimension semantics lack). Forward and backward (splash's fused
``dkv``/``dq`` kernel) are splash's own ``custom_vjp``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa

LANES = 128


def _round_up(x, m):
  return -(-x // m) * m


def block_sizes(lq, lk, block=512):
  """Splash ``BlockSizes`` for ``lq`` queries and ``lk`` keys: ``block`` (a multiple of 128) or the
  sequence rounded up to 128 when shorter; fused backward kernel."""
  if block % LANES:
    raise ValueError(f"splash block {block} must be a multiple of {LANES}")
  bq, bk = min(block, _round_up(lq, LANES)), min(block, _round_up(lk, LANES))
  return sa.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                       block_kv_dkv_compute=bk, use_fused_bwd_kernel=True)


def _pad_mask(mask, lq, lk, lq_p, lk_p, xp):
  """``[..., lq, lk]`` -> ``[..., lq_p, lk_p]``: padded keys False, padded query rows True on real keys."""
  if (lq_p, lk_p) == (lq, lk):
    return mask
  lead = [(0, 0)] * (mask.ndim - 2)
  m = xp.pad(mask, lead + [(0, 0), (0, lk_p - lk)], constant_values=False)
  rows = xp.broadcast_to(xp.arange(lk_p) < lk, mask.shape[:-2] + (lq_p - lq, lk_p))
  return xp.concatenate([m, rows], axis=-2)


def static_mask(mask):
  """A NumPy mask shared by the batch, as ``[Hm, Lq, Lk]``; None for anything else (dynamic)."""
  if not isinstance(mask, np.ndarray):
    return None
  m = mask if mask.ndim == 4 else mask[:, None]
  if m.shape[0] > 1 and not (m == m[:1]).all():
    return None
  return np.asarray(m[0], bool)


class FrameTokenMask(sa.Mask):
  """The padded token mask ``[lq_p, lk_p]`` of a frame-level mask ``frames [Sq, Sk]`` (frames of ``n`` tokens,
  ``lq = Sq*n`` real queries, ``lk = Sk*n`` real keys), computed per requested block: padded keys False, padded
  query rows True on the real keys (as :func:`_pad_mask`)."""

  def __init__(self, frames, n, padded_shape):
    self.frames, self.n = np.asarray(frames, bool), int(n)
    self.lq, self.lk = self.frames.shape[0] * self.n, self.frames.shape[1] * self.n
    self._shape = tuple(int(x) for x in padded_shape)

  @property
  def shape(self):
    return self._shape

  def __getitem__(self, idx):
    qs, ks = idx
    rows, cols = np.arange(self._shape[0])[qs], np.arange(self._shape[1])[ks]
    real_q, real_k = rows < self.lq, cols < self.lk
    fq = np.minimum(rows // self.n, self.frames.shape[0] - 1)
    fk = np.minimum(cols // self.n, self.frames.shape[1] - 1)
    m = self.frames[fq][:, fk] & real_k[None]
    return np.where(real_q[:, None], m, real_k[None, :])

  def __hash__(self):
    return hash((self.frames.shape, self.frames.tobytes(), self.n, self._shape))

  def __eq__(self, other):
    return (isinstance(other, FrameTokenMask) and (self.n, self._shape) == (other.n, other.shape)
            and self.frames.shape == other.frames.shape and bool((self.frames == other.frames).all()))


def _make(mask, **kw):
  """``make_splash_mha`` whose ``is_dynamic_mask`` stays a Python bool: it converts every ``MaskInfo`` leaf
  with ``jnp.array``, which under a trace turns the flag into a tracer its ``__call__`` branches on."""
  kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, **kw)
  dynamic = isinstance(mask, jax.Array)
  for name in ("fwd_mask_info", "dq_mask_info", "dkv_mask_info"):
    info = getattr(kernel, name)
    if info is not None:
      setattr(kernel, name, info._replace(is_dynamic_mask=dynamic))
  return kernel


def attention(q, k, v, mask=None, *, scale=None, block=512, interpret=False, frame_mask=None):
  """``softmax(q k^T * scale, masked) v`` per head with splash attention; see the module docstring.
  ``frame_mask``: ``(frames [Sq, Sk] NumPy bool, tokens_per_frame)`` instead of ``mask``.

  Returns ``[B, Lq, H, D]`` in the dtype of ``q``.
  """
  b, lq, h, d = q.shape
  lk = k.shape[1]
  if k.shape != (b, lk, h, d) or v.shape[:3] != (b, lk, h):
    raise ValueError(f"splash: q {q.shape}, k {k.shape}, v {v.shape} must be [B, L, H, D] with equal B, H, D")
  if frame_mask is not None:
    if mask is not None:
      raise ValueError("splash: pass mask or frame_mask, not both")
    frames, n = np.asarray(frame_mask[0], bool), int(frame_mask[1])
    if frames.ndim != 2 or (frames.shape[0] * n, frames.shape[1] * n) != (lq, lk):
      raise ValueError(f"splash: frame_mask {frames.shape} x {n} tokens does not cover {lq} queries x {lk} keys")
  if mask is not None:
    if mask.ndim not in (3, 4) or mask.shape[-2:] != (lq, lk) or mask.shape[0] not in (1, b):
      raise ValueError(f"splash: mask {mask.shape} must be [1 or B, (1 or H,) {lq}, {lk}]")
    if mask.ndim == 4 and mask.shape[1] not in (1, h):
      raise ValueError(f"splash: mask {mask.shape} has {mask.shape[1]} heads; expected 1 or {h}")
  scale = d**-0.5 if scale is None else scale
  sizes = block_sizes(lq, lk, block)
  lq_p, lk_p = _round_up(lq, sizes.block_q), _round_up(lk, sizes.block_kv)
  make = functools.partial(_make, block_sizes=sizes, interpret=interpret)

  qt = jnp.pad((q * scale).astype(q.dtype), ((0, 0), (0, lq_p - lq), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  kt, vt = (jnp.pad(a, ((0, 0), (0, lk_p - lk), (0, 0), (0, 0))).transpose(0, 2, 1, 3) for a in (k, v))

  if frame_mask is not None:
    kernel = make(sa.MultiHeadMask([FrameTokenMask(frames, n, (lq_p, lk_p))]))
    out = jax.vmap(kernel)(qt, kt, vt)
    return out[:, :, :lq].transpose(0, 2, 1, 3).astype(q.dtype)
  static = None if mask is None else static_mask(mask)
  if mask is None or static is not None:
    if mask is None:
      heads_mask = sa.MultiHeadMask([sa.FullMask((lq_p, lk_p))])
    else:
      padded = _pad_mask(static, lq, lk, lq_p, lk_p, np)
      heads_mask = sa.MultiHeadMask([sa.NumpyMask(m) for m in padded])
    kernel = make(heads_mask)
    seg = None
    if mask is None and lk_p != lk:  # FullMask: padded keys are a segment of their own
      seg = sa.SegmentIds(q=jnp.zeros((lq_p,), jnp.int32), kv=(jnp.arange(lk_p) >= lk).astype(jnp.int32))
    out = jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=seg))(qt, kt, vt)
  else:
    m = jnp.asarray(mask, bool)
    m = m[:, None] if m.ndim == 3 else m  # [Bm, Hm, Lq, Lk]
    m = _pad_mask(m, lq, lk, lq_p, lk_p, jnp)
    if m.shape[0] == 1:
      kernel = make(m[0])
      out = jax.vmap(kernel)(qt, kt, vt)
    else:  # one mask per example: its own block tables
      out = jax.lax.map(lambda a: make(a[0])(*a[1:]), (m, qt, kt, vt))
  return out[:, :, :lq].transpose(0, 2, 1, 3).astype(q.dtype)
