"""Reference multi-head dot-product attention with a boolean mask (softmax in float32).

The model dispatches through ``jaxwm.kernels.dot_product_attention`` (``model.attention_impl``), which adds
TPU splash attention (``pallas_kernels.splash_attention``) to the names here.
"""

import dataclasses
import functools
import logging

import flax
import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("xla", "cudnn", "auto")


def resolve_impl(impl):
  """``"auto"`` -> ``"cudnn"`` on GPU, else ``"xla"`` (logged). Unknown names are an error."""
  if impl not in IMPLS:
    raise ValueError(f"attention impl must be one of {IMPLS}; got {impl!r}")
  if impl == "auto":
    impl = "cudnn" if jax.default_backend() == "gpu" else "xla"
    logging.info("attention impl 'auto' resolved to %r on backend %r", impl, jax.default_backend())
  return impl


def expand_frame_mask(mask, tokens_per_frame):
  """Frame-level ``[B, (H,) Sq, Sk]`` bool mask -> token-level ``[B, (H,) Sq*N, Sk*N]``."""
  *lead, sq, sk = mask.shape
  n = tokens_per_frame
  m = jnp.broadcast_to(mask[..., :, None, :, None], (*lead, sq, n, sk, n))
  return m.reshape(*lead, sq * n, sk * n)


@dataclasses.dataclass(frozen=True, eq=False)
class StaticFrameMask:
  """A frame-level mask known when tracing (a layout's, with no chunk drop or head windows): ``frames`` bool
  NumPy ``[Sq, Sk]``, each frame ``tokens_per_frame`` consecutive tokens. As a mask it stands for the token mask
  ``[1, Sq*N, Sk*N]`` (:meth:`tokens`); hashable, so it can be static in a traced pytree. Kernels may use it
  without ever building the token mask (splash: its blocks computed on the host)."""
  frames: np.ndarray
  tokens_per_frame: int = 1

  def __post_init__(self):
    object.__setattr__(self, "frames", np.asarray(self.frames, bool))
    if self.frames.ndim != 2:
      raise ValueError(f"StaticFrameMask.frames must be [Sq, Sk]; got shape {self.frames.shape}")

  def __hash__(self):
    return hash((self.frames.shape, self.frames.tobytes(), self.tokens_per_frame))

  def __eq__(self, other):
    return (isinstance(other, StaticFrameMask) and self.tokens_per_frame == other.tokens_per_frame
            and self.frames.shape == other.frames.shape and bool((self.frames == other.frames).all()))

  @property
  def shape(self):
    sq, sk = self.frames.shape
    return (1, sq * self.tokens_per_frame, sk * self.tokens_per_frame)

  ndim = 3

  def with_tokens_per_frame(self, n):
    return dataclasses.replace(self, tokens_per_frame=int(n))

  def tokens(self):
    """The token mask ``[1, Sq*N, Sk*N]`` bool (a broadcast of the frame mask, for XLA to fuse)."""
    return expand_frame_mask(jnp.asarray(self.frames)[None], self.tokens_per_frame)


@flax.struct.dataclass
class FrameMask:
  """A traced frame-level mask (a layout's with this step's chunk drop or per-head windows): ``frames`` bool
  ``[Bm, (Hm,) Sq, Sk]``, each frame ``tokens_per_frame`` consecutive tokens. As a mask it stands for the token
  mask ``[Bm, (Hm,) Sq*N, Sk*N]`` (:meth:`tokens`). Kernels may use the frame mask directly (splash: block tables
  from it, no ``[L, L]`` array)."""
  frames: jax.Array
  tokens_per_frame: int = flax.struct.field(pytree_node=False, default=1)

  @property
  def shape(self):
    *lead, sq, sk = self.frames.shape
    return (*lead, sq * self.tokens_per_frame, sk * self.tokens_per_frame)

  @property
  def ndim(self):
    return self.frames.ndim

  def tokens(self):
    """The token mask (a broadcast of the frame mask, for XLA to fuse)."""
    return expand_frame_mask(self.frames, self.tokens_per_frame)


def dot_product_attention(q, k, v, mask=None, *, scale=None, impl="xla"):
  """``softmax(q k^T * scale + log(mask)) v`` per head.

  Args:
    q: ``[B, Lq, H, D]``; k, v: ``[B, Lk, H, D]``.
    mask: bool, broadcastable to ``[B, Lq, Lk]`` or per head ``[B, H, Lq, Lk]`` (True = attend),
      a :class:`StaticFrameMask` or :class:`FrameMask`, or None (dense). Every query must attend to at
      least one key.
    scale: defaults to ``D ** -0.5``.
    impl: ``"xla"`` (this reference), ``"cudnn"`` (``jax.nn.dot_product_attention`` with
      cuDNN, GPU only) or ``"auto"``.

  Returns:
    ``[B, Lq, H, D]`` in the dtype of ``q``.
  """
  impl = resolve_impl(impl)
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  if isinstance(mask, (StaticFrameMask, FrameMask)):
    mask = mask.tokens()
  if impl == "cudnn":
    m = None
    if mask is not None:
      m = mask[:, None] if mask.ndim == 3 else mask
      m = jnp.broadcast_to(m, (q.shape[0], m.shape[1], q.shape[1], k.shape[1]))
      q, k, v, m = pad_to_even(q, k, v, m)  # cuDNN trains a masked attention on even lengths only
    out = jax.nn.dot_product_attention(q, k, v, mask=m, scale=scale, implementation="cudnn")
    return out[:, :mask.shape[-2]] if mask is not None else out
  probs = attention_weights(q, k, mask, scale=scale)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v).astype(q.dtype)


def softmax_attention(logits, args, v, mask=None):
  """``softmax(logits(*args) + log(mask)) v``: attention over any logits (WorldRoPE's per-view keys).

  ``logits(*args) -> [B, H, Lq, Lk]`` float32, already scaled (hashable: a module-level function or a
  ``functools.partial`` of one); ``v [B, Lk, H, D]``; ``mask`` bool broadcastable to ``[B, Lq, Lk]`` or
  ``[B, H, Lq, Lk]`` (True = attend) or None. Returns ``[B, Lq, H, D]`` in ``v``'s dtype.
  """
  s = logits(*args)
  if mask is not None:
    s = jnp.where(mask[:, None] if mask.ndim == 3 else mask, s, -jnp.inf)
  probs = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)


def per_view_logits(q_views, k_views, q_shared, k_shared, *, scale):
  """``[B, H, Lq, Lk]`` float32: ``scale (q_views_i . k_views[f]_j + q_shared_i . k_shared_j)`` with ``f`` query
  ``i``'s frame (WorldRoPE's per-view keys). ``q_views [B, Lq, H, C]``, ``k_views [B, F, Lk, H, C]``, ``q_shared
  [B, Lq, H, R]``, ``k_shared [B, Lk, H, R]``; ``Lq = F N``, frame ``f`` the queries ``f N .. f N + N - 1``."""
  b, lq, h, c = q_views.shape
  f = k_views.shape[1]
  qf = q_views.reshape(b, f, lq // f, h, c)
  logits = jnp.einsum("bfnhc,bfkhc->bhfnk", qf, k_views, preferred_element_type=jnp.float32)
  logits = logits.reshape(b, h, lq, -1)
  if q_shared.shape[-1]:
    logits = logits + jnp.einsum("bqhc,bkhc->bhqk", q_shared, k_shared, preferred_element_type=jnp.float32)
  return logits * scale


def pair_channels(pairs):
  """Head channels of the channel pairs ``pairs`` (pair ``c`` is channels ``2c, 2c + 1``), in order (static)."""
  return np.asarray([c for p in pairs for c in (2 * p, 2 * p + 1)], np.int32)


def rotate_pairs(k, factors, pairs):
  """Keys as each query view sees them: ``k [B, Lk, H, D]``'s channel ``pairs`` (pair ``c`` is channels ``2c,
  2c + 1``), as complex numbers, times ``factors [B, F, Lk, P, 2]`` (re, im) -> ``[B, F, Lk, H, 2P]`` (the pairs'
  channels in :func:`pair_channels` order) in ``k``'s dtype: WorldRoPE's expected rotary factor of each key in each
  view, the same for every head."""
  b, lk, h, _ = k.shape
  kp = k[..., pair_channels(pairs)].astype(jnp.float32).reshape(b, 1, lk, h, len(pairs), 2)
  re, im = factors[:, :, :, None, :, 0], factors[:, :, :, None, :, 1]  # [B, F, Lk, 1, P]
  out = jnp.stack([kp[..., 0] * re - kp[..., 1] * im, kp[..., 0] * im + kp[..., 1] * re], -1)
  return out.reshape(out.shape[:4] + (2 * len(pairs),)).astype(k.dtype)


def per_view_views(q, k, factors, pairs):
  """:func:`per_view_logits`' arguments ``(q_views, k_views, q_shared, k_shared)`` for :func:`per_view_attention`'s
  inputs: the rotated pairs' channels and the others."""
  channels = pair_channels(pairs)
  rest = np.setdiff1d(np.arange(q.shape[-1]), channels)
  return q[..., channels], rotate_pairs(k, factors, pairs), q[..., rest], k[..., rest]


def per_view_attention(q, k, v, factors, pairs, mask=None, *, scale):
  """Softmax attention whose keys depend on the query frame (WorldRoPE): query frame ``f`` sees ``k`` with its
  channel ``pairs`` rotated by ``factors[:, f]`` (:func:`rotate_pairs`), the other channels as they are.

  ``q [B, F N, H, D]``, ``k [B, Lk, H, D]``, ``v [B, Lk, H, Dv]``, ``factors [B, F, Lk, P, 2]``, ``pairs`` the ``P``
  pair indices (static), ``mask`` bool broadcastable to ``[B, F N, Lk]`` or None -> ``[B, F N, H, Dv]`` in ``v``'s
  dtype.
  """
  logits = functools.partial(per_view_logits, scale=scale)
  return softmax_attention(logits, per_view_views(q, k, factors, pairs), v, mask)


def pad_to_even(q, k, v, mask):
  """``q [B, Lq, H, D]``, ``k, v [B, Lk, H, D]``, ``mask [B, Hm, Lq, Lk]`` padded to even ``Lq``, ``Lk`` with zero
  tokens: padded keys are masked out for every query, padded queries attend to every key (their rows are
  sliced off the output, so they neither produce NaN nor pass a gradient). Unchanged when both are even."""
  pq, pk = q.shape[1] % 2, k.shape[1] % 2
  if not (pq or pk):
    return q, k, v, mask
  tok = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0))) if n else x  # pylint: disable=unnecessary-lambda-assignment
  mask = jnp.pad(mask, ((0, 0), (0, 0), (0, pq), (0, pk)), constant_values=False)
  if pq:
    mask = mask.at[:, :, -1, :].set(True)
  return tok(q, pq), tok(k, pk), tok(v, pk), mask


def attention_weights(q, k, mask=None, *, scale=None):
  """The softmax weights ``[B, H, Lq, Lk]`` (float32) of :func:`dot_product_attention` (same arguments)."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  if isinstance(mask, (StaticFrameMask, FrameMask)):
    mask = mask.tokens()
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    logits = jnp.where(mask[:, None] if mask.ndim == 3 else mask, logits, -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)
