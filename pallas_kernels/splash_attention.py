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
- ``frame_mask=(frames, n)`` with ``frames`` a traced ``jax.Array [Bm, (Hm,) Sq, Sk]`` (a layout's mask with
  this step's chunk drop or per-head windows, ReWorld's recipe): each frame's tokens are padded to a multiple
  of 128 and the blocks tile frames exactly (:func:`frame_blocks`), so every block is one frame pair: empty,
  full, or (a frame's last key block, when padded) the one static "real keys" pattern; a whole padded frame per
  block up to ``frame_block`` (1024) tokens. The block tables are
  computed on device from the frame mask (``[Hm, Sq*r, Sk*r]`` small integers); nothing of size ``[Lq, Lk]``
  exists, whatever the heads. Its backward is splash's separate dq and dkv kernels (the fused one holds a dq
  partial per key block, large with frame-sized blocks). Padding costs ``padded / n`` more work per frame pair:
  little for Wan's frames (240 -> 256, 384, 880 -> 896 tokens), a lot for frames of a few dozen tokens;
- a ``jax.Array`` token mask: splash's dynamic mask, whose tables are computed on device from the mask and
  whose partial blocks are the (padded) mask itself (``[Hm, Lq, Lk]`` in the kernel's memory).

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
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi

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


FRAME_BLOCK = 1024  # largest frame-aligned block (a whole padded frame up to 1024 tokens: Wan's 720p has 880)
TABLE_BYTES = 512 * 1024  # block tables per kernel call; they are prefetched to scalar memory (1 MiB on v5p)


def frame_blocks(n, block=FRAME_BLOCK):
  """``(padded, blk)``: frames of ``n`` tokens padded to ``padded`` (``n`` rounded up to 128) and the splash block
  ``blk``, the largest multiple of 128 that divides ``padded`` and is at most ``max(block, 128)``."""
  padded = _round_up(n, LANES)
  return padded, max(b for b in range(LANES, max(min(block, padded), LANES) + 1, LANES) if padded % b == 0)


def _smallest_int(limit):
  return np.int8 if limit <= np.iinfo(np.int8).max else np.int16 if limit <= np.iinfo(np.int16).max else np.int32


def heads_per_call(nq, nk, partial, budget=None):
  """Mask heads whose block tables (``block_mask``, ``data_next``, ``mask_next`` when ``partial``; ``nq x nk``
  each) fit ``budget`` bytes of scalar memory; a ``ValueError`` when not even one does."""
  budget = TABLE_BYTES if budget is None else budget
  per_head = nq * nk * (1 + np.dtype(_smallest_int(max(nq, nk))).itemsize + (1 if partial else 0))
  if per_head > budget:
    raise ValueError(f"splash: frame-mask block tables of {nq} x {nk} blocks need {per_head} bytes per head, over "
                     f"the {budget} bytes of scalar memory a kernel call may use; use larger blocks (frame_block) "
                     "or a shorter sequence")
  return budget // per_head


def frame_mask_info(frames, n, blk, padded, dkv=False):
  """Splash ``MaskInfo`` of a traced frame mask ``[Hm, Sq, Sk]`` over blocks of ``blk`` tokens, frames of ``n``
  real tokens padded to ``padded``: block ``(i, j)`` is frame pair ``(i // r, j // r)``, ``r = padded // blk``.
  ``block_mask`` 0 (frames masked), 2 (visible, all keys real), 1 (visible, the frame's last key block with
  padded keys: partial pattern 0, keys ``< n - (r - 1) * blk``); ``data_next`` the next visible key block of the
  row (query block of the column for ``dkv``, splash's backward order), so empty steps prefetch useful data."""
  r = padded // blk
  vis = jnp.repeat(jnp.repeat(jnp.asarray(frames, bool), r, axis=-2), r, axis=-1)  # [Hm, Sq*r, Sk*r]
  _, nq, nk = vis.shape
  real_cols = n - (r - 1) * blk
  partial = (np.arange(nk) % r == r - 1) & (real_cols < blk)  # [nk] static
  block_mask = jnp.where(vis, jnp.where(jnp.asarray(partial)[None, None], 1, 2), 0).astype(np.int8)
  axis, count = (1, nq) if dkv else (2, nk)
  idx = jnp.arange(count, dtype=jnp.int32).reshape((1, count, 1) if dkv else (1, 1, count))
  nxt = jax.lax.cummin(jnp.where(vis, idx, count), axis=axis, reverse=True)
  data_next = jnp.where(nxt == count, 0, nxt).astype(_smallest_int(count))
  has_partial = bool(partial.any())
  keys = np.arange(blk) < real_cols
  pattern = np.broadcast_to(keys[:, None] if dkv else keys[None, :], (1, blk, blk))  # dkv: [key, query] blocks
  return smi.MaskInfo(data_next=data_next, mask_next=jnp.zeros_like(block_mask) if has_partial else None,
                      block_mask=block_mask, partial_mask_blocks=jnp.asarray(pattern) if has_partial else None,
                      q_sequence=None, is_dynamic_mask=True)


def _frame_kernel(frames, n, blk, padded, sizes, interpret):
  """A splash kernel over frame-aligned blocks for one traced frame mask ``[Hm, Sq, Sk]``."""
  fwd = frame_mask_info(frames, n, blk, padded)  # the dq kernel walks the blocks in the forward's order
  dkv = frame_mask_info(frames, n, blk, padded, dkv=True)
  return sk.SplashAttentionKernel(fwd, fwd, dkv, block_sizes=sizes, is_mqa=False, save_residuals=False,
                                  mask_value=sk.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
                                  residual_checkpoint_name=None, mask_function=None, interpret=interpret)


def _frame_attention(q, k, v, frames, n, scale, block, interpret):
  """Splash over a traced frame mask ``[Bm, (Hm,) Sq, Sk]`` (module docstring); ``q [B, Sq*n, H, D]``. Per-head
  masks run in groups of heads whose block tables fit scalar memory (:func:`heads_per_call`), one call each."""
  b, lq, h, d = q.shape
  frames = jnp.asarray(frames, bool)
  frames = frames[:, None] if frames.ndim == 3 else frames  # [Bm, Hm, Sq, Sk]
  sq, sk = frames.shape[-2:]
  if frames.shape[0] not in (1, b) or frames.shape[1] not in (1, h) or (sq * n, sk * n) != (lq, k.shape[1]):
    raise ValueError(f"splash: frame_mask {frames.shape} x {n} tokens does not cover {lq} queries x {k.shape[1]} "
                     f"keys of {b} examples and {h} heads")
  padded, blk = frame_blocks(n, block)
  # Separate dq and dkv backward kernels: the fused one keeps a dq partial per key block ([Lk / blk, H, Lq, D]),
  # which frame-sized blocks make large (BENCHMARKS.md, splash's mask paths).
  sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                        block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk, use_fused_bwd_kernel=False)

  def per_frame(x, s):  # [B, s*n, H, D] -> [B, H, s*padded, D]
    x = jnp.pad(x.reshape(b, s, n, h, d), ((0, 0), (0, 0), (0, padded - n), (0, 0), (0, 0)))
    return x.reshape(b, s * padded, h, d).transpose(0, 2, 1, 3)

  qt, kt, vt = per_frame((q * scale).astype(q.dtype), sq), per_frame(k, sk), per_frame(v, sk)
  r = padded // blk
  hm = frames.shape[1]
  group = hm if hm == 1 else min(hm, heads_per_call(sq * r, sk * r, n % blk != 0))

  def call(fr, qt, kt, vt):  # fr [Bm, g, Sq, Sk]; qt, kt, vt [B, g or H, L, D]
    if fr.shape[0] == 1:
      return jax.vmap(_frame_kernel(fr[0], n, blk, padded, sizes, interpret))(qt, kt, vt)
    # one mask per example: its own block tables
    return jax.lax.map(lambda a: _frame_kernel(a[0], n, blk, padded, sizes, interpret)(*a[1:]), (fr, qt, kt, vt))

  if hm == 1:
    out = call(frames, qt, kt, vt)
  else:
    out = jnp.concatenate([call(frames[:, g:g + group], qt[:, g:g + group], kt[:, g:g + group], vt[:, g:g + group])
                           for g in range(0, h, group)], axis=1)
  out = out.transpose(0, 2, 1, 3).reshape(b, sq, padded, h, d)[:, :, :n]
  return out.reshape(b, lq, h, d).astype(q.dtype)


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


def attention(q, k, v, mask=None, *, scale=None, block=512, interpret=False, frame_mask=None,
              frame_block=FRAME_BLOCK):
  """``softmax(q k^T * scale, masked) v`` per head with splash attention; see the module docstring.
  ``frame_mask``: ``(frames, tokens_per_frame)`` instead of ``mask``, ``frames`` a NumPy bool ``[Sq, Sk]``
  (static) or a ``jax.Array [Bm, (Hm,) Sq, Sk]`` (traced, blocks of at most ``frame_block`` tokens).

  Returns ``[B, Lq, H, D]`` in the dtype of ``q``.
  """
  b, lq, h, d = q.shape
  lk = k.shape[1]
  if k.shape != (b, lk, h, d) or v.shape[:3] != (b, lk, h):
    raise ValueError(f"splash: q {q.shape}, k {k.shape}, v {v.shape} must be [B, L, H, D] with equal B, H, D")
  scale = d**-0.5 if scale is None else scale
  if frame_mask is not None:
    if mask is not None:
      raise ValueError("splash: pass mask or frame_mask, not both")
    if isinstance(frame_mask[0], jax.Array):  # traced: frame-aligned blocks
      return _frame_attention(q, k, v, frame_mask[0], int(frame_mask[1]), scale, frame_block, interpret)
    frames, n = np.asarray(frame_mask[0], bool), int(frame_mask[1])
    if frames.ndim != 2 or (frames.shape[0] * n, frames.shape[1] * n) != (lq, lk):
      raise ValueError(f"splash: frame_mask {frames.shape} x {n} tokens does not cover {lq} queries x {lk} keys")
  if mask is not None:
    if mask.ndim not in (3, 4) or mask.shape[-2:] != (lq, lk) or mask.shape[0] not in (1, b):
      raise ValueError(f"splash: mask {mask.shape} must be [1 or B, (1 or H,) {lq}, {lk}]")
    if mask.ndim == 4 and mask.shape[1] not in (1, h):
      raise ValueError(f"splash: mask {mask.shape} has {mask.shape[1]} heads; expected 1 or {h}")
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
