"""Layout, padding and the ``custom_vjp`` shared by the TPU and GPU frame-sparse kernels.

Kernels see frames padded to ``Np`` tokens (a multiple of the blocks; padded key columns are
masked, padded query rows are sliced off) in the layout ``[B, H, F, Np, D]``, and the frame
lists flattened to ``[B * Fq * M]`` int32. The backward pass of a kernel returns ``dk``/``dv``
per (query frame, slot) -- each already summed over every query block of that frame -- and
they are accumulated into the key frames here with a segment sum (linear in the frames).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

NEG = -1e30  # masked logit (finite, so a block's running max stays finite)


@dataclasses.dataclass(frozen=True)
class Dims:
  """Static sizes of one call (hashable: it parameterises the kernels)."""
  n: int        # tokens per frame
  np_: int      # padded tokens per frame
  fq: int
  fk: int
  slots: int    # M
  block_q: int
  block_k: int
  scale: float
  interpret: object

  @property
  def nq(self):
    return self.np_ // self.block_q

  @property
  def nk(self):
    return self.np_ // self.block_k


def round_block(n, block, multiple):
  """A block size: ``block`` if given, else the smallest multiple of ``multiple`` covering ``n``, at most 128."""
  if block is not None:
    return block
  return min(128, -(-n // multiple) * multiple)


def to_frames(x, n, np_):
  """``[B, F*N, H, D] -> [B, H, F, Np, D]`` (zero padding)."""
  b, l, h, d = x.shape
  x = x.reshape(b, l // n, n, h, d).transpose(0, 3, 1, 2, 4)
  return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, np_ - n), (0, 0)))


def from_frames(x, n):
  """``[B, H, F, Np, D] -> [B, F*N, H, D]``."""
  b, h, f, _, d = x.shape
  return x[:, :, :, :n].transpose(0, 2, 3, 1, 4).reshape(b, f * n, h, d)


def accumulate_keys(part, idx, fk):
  """``part [B, H, Fq, M, Np, D]`` per selected slot -> ``[B, H, Fk, Np, D]`` summed per key frame."""
  b, h, fq, m, np_, d = part.shape
  seg = jnp.where(idx >= 0, idx, fk).reshape(b, fq * m)  # -1 -> out of range -> dropped
  flat = part.transpose(0, 2, 3, 1, 4, 5).reshape(b, fq * m, h, np_, d)
  summed = jax.vmap(lambda p, s: jax.ops.segment_sum(p, s, num_segments=fk))(flat, seg)
  return summed.transpose(0, 2, 1, 3, 4)


def pad_channels(x, size):
  """Zero-pads the last axis of ``x`` to ``size``."""
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def make_attention(forward, backward, default_multiple, pow2_channels=False):
  """Builds ``attention(q, k, v, frame_idx, *, tokens_per_frame, scale, block_q, block_k, interpret)``.

  ``forward(q, k, v, idx, dims) -> (o, lse)`` and ``backward(q, k, v, idx, o, lse, do, dims) ->
  (dq, dk_part, dv_part)`` work in the padded frame layout. ``pow2_channels``: head channels are
  zero-padded to a power of two (Triton's blocks must be), which changes no logit.
  """

  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def core(q, k, v, idx, dims):
    return forward(q, k, v, idx, dims)[0]

  def core_fwd(q, k, v, idx, dims):
    o, lse = forward(q, k, v, idx, dims)
    return o, (q, k, v, idx, o, lse)

  def core_bwd(dims, res, do):
    q, k, v, idx, o, lse = res
    dq, dk_part, dv_part = backward(q, k, v, idx, o, lse, do, dims)
    b = q.shape[0]
    sel = idx.reshape(b, dims.fq, dims.slots)
    dk = accumulate_keys(dk_part, sel, dims.fk).astype(k.dtype)
    dv = accumulate_keys(dv_part, sel, dims.fk).astype(v.dtype)
    return dq.astype(q.dtype), dk, dv, None

  core.defvjp(core_fwd, core_bwd)

  def attention(q, k, v, frame_idx, *, tokens_per_frame, scale=None, block_q=None, block_k=None, interpret=False):
    """Same contract as ``jaxwm.ops.frame_sparse.gathered_attention``; ``block_q``/``block_k`` tile
    the tokens of a frame (default: the frame padded, at most 128); ``interpret`` runs on CPU."""
    n = tokens_per_frame
    b, lq, h, d = q.shape
    if lq % n or k.shape[1] % n:
      raise ValueError(f"q {q.shape} / k {k.shape} lengths are not multiples of tokens_per_frame={n}")
    fq, fk = lq // n, k.shape[1] // n
    if frame_idx.shape[:2] != (b, fq):
      raise ValueError(f"frame_idx shape {frame_idx.shape} must start with (B, Fq) = {(b, fq)}")
    scale = d**-0.5 if scale is None else scale
    width = 1 << (d - 1).bit_length() if pow2_channels else d
    if width != d:
      q, k, v = (pad_channels(x, width) for x in (q, k, v))
    bq = round_block(n, block_q, default_multiple)
    bk = round_block(n, block_k, default_multiple)
    step = math.lcm(bq, bk)
    dims = Dims(n=n, np_=-(-n // step) * step, fq=fq, fk=fk, slots=frame_idx.shape[2], block_q=bq, block_k=bk,
                scale=float(scale), interpret=interpret)
    idx = frame_idx.astype(jnp.int32).reshape(-1)
    out = core(to_frames(q, n, dims.np_), to_frames(k, n, dims.np_), to_frames(v, n, dims.np_), idx, dims)
    return from_frames(out, n)[..., :d]

  return attention
