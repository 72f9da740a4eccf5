"""Self- and cross-attention of the DiT blocks (Wan; docs/design.md §4-7).

Self-attention reads the queries' frames and the cached frames as :class:`Encoded` (RoPE angles and
the camera encoding's tensors) and applies the encoding's transforms (``jaxwm.encodings``); which
keys each query sees is an :class:`AttentionMask`. Three kinds of layer:

- ``softmax`` with dense attention: the token mask over ``[cache; own]`` keys;
- ``softmax`` with frame-sparse attention (ViewRope Alg. 1): selection among the history frames
  plus the own chunk, gathered (``jaxwm.kernels``);
- ``hybrid`` (LOCI): the own chunk only, gathered; no cache keys are read or kept.
"""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm import kernels
from jaxwm.encodings.base import ChannelPlan
from jaxwm.encodings.rope3d import apply_rotary
from jaxwm.models.config import ModelConfig
from jaxwm.layers import RMSNorm, batch_mesh_axes, dense
from jaxwm.ops import frame_sparse
from jaxwm.ops.attention import FrameMask, attention_weights, expand_frame_mask


def _dense(cfg, q, k, v, tokens):
  """Dense attention by ``model.attention_impl`` (``jaxwm.kernels.dot_product_attention``); kernels run per
  batch shard and per head shard (the mesh axes of the logical ``act_heads`` axis)."""
  heads = nn.logical_to_mesh_axes(("act_heads",))
  heads = () if not heads or heads[0] is None else (heads[0] if isinstance(heads[0], tuple) else (heads[0],))
  return kernels.dot_product_attention(q, k, v, tokens, impl=cfg.attention_impl, interpret=cfg.attention.interpret,
                                       batch_axes=batch_mesh_axes(), head_axes=heads)


@flax.struct.dataclass
class AttentionMask:
  """Which keys each query reads; keys are ``[cache_frames cache slots; own frames]``.

  ``tokens``: the token-level mask ``[B, (H,) Lq, Lk]`` for dense attention (None: all), a bool array or a
  traced :class:`jaxwm.ops.attention.FrameMask`, or instead ``static``, a
  :class:`jaxwm.ops.attention.StaticFrameMask` with the same meaning, known at trace time;
  ``history``: ``[B, Sq, Sk]`` bool frames frame-sparse attention selects from (never the own
  chunk); ``local``: ``[B, Sq, C]`` int own-chunk key frames (-1 pads); ``tokens_per_frame``,
  ``cache_frames``: static.
  """
  tokens: jax.Array = None
  history: jax.Array = None
  local: jax.Array = None
  tokens_per_frame: int = flax.struct.field(pytree_node=False, default=1)
  cache_frames: int = flax.struct.field(pytree_node=False, default=0)
  static: object = flax.struct.field(pytree_node=False, default=None)  # StaticFrameMask instead of tokens

  def dense(self):
    """The mask dense attention takes: the static frame mask, else ``tokens``."""
    return self.static if self.static is not None else self.tokens

  def token_mask(self):
    """``tokens``, built from the static frame mask when that is what this mask holds."""
    if self.static is not None:
      return self.static.tokens()
    return self.tokens.tokens() if isinstance(self.tokens, FrameMask) else self.tokens

  def own_chunk(self):
    """``local`` as indices into the own frames alone (hybrid layers read no cache keys)."""
    return jnp.where(self.local >= 0, self.local - self.cache_frames, -1)


class Attention(nn.Module):
  """Multi-head attention with q/k RMSNorm across heads (Wan).

  Self-attention: ``__call__(x, queries=Encoded, cached=Encoded or None, cache_kv=..., mask=AttentionMask)``
  with ``x [B, L, dim]`` returns ``(out [B, L, dim], own per-key entries, selected or None)``.
  ``cache_kv``: the layer's cached raw ``{"k", "v", ...}`` ``[B, M*N, H, Dh]`` (None: no cache, and
  always None in ``hybrid`` layers). Own entries are raw too (what a streaming commit stores).
  Cross-attention: ``__call__(x, context=ctx)`` returns ``out``.
  """
  cfg: ModelConfig
  kind: str = "softmax"  # softmax | hybrid | cross

  @nn.compact
  def __call__(self, x, *, context=None, queries=None, cached=None, cache_kv=None, mask=None):
    cfg = self.cfg
    h, d, dt = cfg.num_heads, cfg.head_dim, cfg.compute_dtype
    src = x if context is None else context
    q = RMSNorm(cfg.eps, name="norm_q")(dense(cfg.dim, ("embed", "heads"), "to_q", dt)(x))
    k = RMSNorm(cfg.eps, name="norm_k")(dense(cfg.dim, ("embed", "heads"), "to_k", dt)(src))
    v = dense(cfg.dim, ("embed", "heads"), "to_v", dt)(src)
    q, k, v = (a.reshape(a.shape[:2] + (h, d)) for a in (q, k, v))
    to_out = dense(cfg.dim, ("heads", "embed"), "to_out", dt)
    if self.kind == "cross":  # no positions, no cameras
      out = _dense(cfg, q, k, v, None)
      return to_out(out.reshape(out.shape[:2] + (cfg.dim,)))
    enc = cfg.encoding
    plan = ChannelPlan(cfg.camera, d)
    if enc.per_view_keys:
      out, own = enc.attend(cfg, x, q, k, v, queries, cached, cache_kv, mask.token_mask() if mask else None, plan)
      return to_out(out.reshape(out.shape[:2] + (cfg.dim,))), own, None
    params = enc.attention_params(cfg)
    own = {"k": k, "v": v}
    q = enc.encode_q(apply_rotary(q, queries.rope), queries.cam, plan)
    k, v = enc.encode_kv(apply_rotary(k, queries.rope), v, queries.cam, plan, params)
    if cache_kv is not None:
      kc, vc = enc.encode_kv(apply_rotary(cache_kv["k"].astype(k.dtype), cached.rope), cache_kv["v"].astype(v.dtype),
                             cached.cam, plan, params)
      k, v = jnp.concatenate([kc, k], axis=1), jnp.concatenate([vc, v], axis=1)
    q = nn.with_logical_constraint(q, ("batch", "length", "act_heads", "act_kv"))
    selected, frame_idx = None, None
    n = mask.tokens_per_frame if mask is not None else 1
    if self.kind == "hybrid":  # LOCI: softmax over the own chunk only
      frame_idx = mask.own_chunk()
      out = kernels.gathered_attention(q, k, v, frame_idx, tokens_per_frame=n, impl=cfg.attention.impl,
                                       interpret=cfg.attention.interpret, batch_axes=batch_mesh_axes())
    elif cfg.attention.sparse:
      out, selected = self._sparse(q, k, v, mask)
      frame_idx = jnp.concatenate([jnp.broadcast_to(mask.local, selected.shape[:2] + mask.local.shape[-1:]),
                                   selected], -1)
    else:
      out = _dense(cfg, q, k, v, None if mask is None else mask.dense())
    if self.is_mutable_collection("intermediates") and self.kind == "softmax":  # analysis only
      self._sow_weights(q, k, mask, frame_idx)
    out, residual = enc.decode(out, queries.cam, plan, params)
    out = to_out(out.reshape(out.shape[:2] + (cfg.dim,)))
    return (out if residual is None else out + residual), own, selected

  def _sow_weights(self, q, k, mask, frame_idx):
    """Sows the head-averaged attention weights ``[B, Lq, Lk]`` as ``intermediates/.../attn_weights``;
    for frame-sparse attention over the selected and own-chunk frames only."""
    tokens = None if mask is None else mask.token_mask()
    if frame_idx is not None:
      fk = k.shape[1] // mask.tokens_per_frame
      tokens = expand_frame_mask(frame_sparse.indices_to_mask(frame_idx, fk), mask.tokens_per_frame)
    self.sow("intermediates", "attn_weights", attention_weights(q, k, tokens).mean(axis=1))

  def _sparse(self, q, k, v, mask):
    """Frame-sparse attention (ViewRope Alg. 1): select history frames, attend to them and the own chunk."""
    ac = self.cfg.attention
    key = self.make_rng("frame_select") if self.has_rng("frame_select") else None
    select_key = None
    if ac.selection != "topk":
      if key is None:
        raise ValueError(f"model.attention.selection={ac.selection!r} needs rngs={{'frame_select': key}}")
      key, select_key = jax.random.split(key)
    return kernels.frame_sparse_attention(
        q, k, v, tokens_per_frame=mask.tokens_per_frame, history=mask.history, local_idx=mask.local,
        top_k=ac.top_k, sparsity=ac.sparsity, num_samples=ac.num_samples, window=ac.window, mode=ac.selection,
        key=key, select_key=select_key, impl=ac.impl, interpret=ac.interpret, batch_axes=batch_mesh_axes())
