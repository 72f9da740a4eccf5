"""Wan 2.x-style DiT in Flax Linen (docs/design.md §2, §4; diffusers' ``WanTransformer3DModel``).

Frames in, velocity out, over a *frame sequence* ``[B, S, h, w, C]`` that may mix clean and
noisy frames (the teacher-forcing layout) or be one chunk attending to a KV cache (streaming).
Per-frame (or per-token) timesteps and a :class:`jaxwm.models.conditioning.Frames` (positions,
cameras, masks) say which is which; see ``jaxwm.training.layout`` and ``jaxwm.sampling``.

The layers are scanned in runs of identical blocks (``ModelConfig.layer_groups``): one stack
``blocks`` without LOCI; with LOCI, stacks ``blocks_<start>_<end>`` of softmax or hybrid blocks,
so only hybrid blocks carry memory parameters.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.encodings.base import ChannelPlan, Encoded, model_poses
from jaxwm.encodings.plucker import plucker_tokens
from jaxwm.encodings.rope3d import rope3d_angles
from jaxwm.models import loci as loci_lib
from jaxwm.models.attention import Attention, AttentionMask
from jaxwm.models.cache import Entries
from jaxwm.models.conditioning import Frames
from jaxwm.models.config import ModelConfig
from jaxwm.models.embeddings import TextProjection, TimeEmbedding
from jaxwm.layers import LayerNorm, dense
from jaxwm.ops import frame_sparse
from jaxwm.ops.attention import FrameMask

# Custom kernels' forward primitives: the C++ kernels of xla_kernels/ (an XLA FFI call), Pallas kernels, cuDNN's
# attention. A kernel's custom_vjp must bind its primitive in its fwd rule (not call the custom_vjp function again:
# a remat policy sees a nested custom_vjp_call as an ordinary, recomputable value).
KERNEL_PRIMITIVES = ("ffi_call", "pallas_call", "dot_product_attention_fwd_wrapper")


def dots_and_kernels_saveable(prim, *avals, **params):
  """Remat policy ``"dots_and_kernels"``: saves the matmuls without batch dimensions (as jax's
  ``dots_with_no_batch_dims_saveable``) and the outputs of custom kernels (``KERNEL_PRIMITIVES``: ``cpu_flash``
  attention, WorldRoPE's view factors, Pallas kernels, cuDNN), so that no kernel runs twice; the elementwise rest
  (norms, modulation, gates, activations, RoPE) is recomputed in the backward from them, and so is attention written
  in ``jnp`` (``xla``, ``xla_lse``: batched matmuls). On CPU that is cheaper than stacking its residuals over the
  layer scan (BENCHMARKS.md, "Recompute the elementwise work: `model.remat="dots_and_kernels"`")."""
  return prim.name in KERNEL_PRIMITIVES or jax.checkpoint_policies.dots_with_no_batch_dims_saveable(
      prim, *avals, **params)


_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_and_kernels": dots_and_kernels_saveable,
}


def _table_init(key, shape, dtype=jnp.float32):
  """Wan's modulation table init: ``randn / sqrt(dim)``."""
  return jax.random.normal(key, shape, dtype) / shape[-1] ** 0.5


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class Block(nn.Module):
  """One DiT block: modulated self-attention, optional cross-attention, modulated GELU-tanh FFN.

  Scanned over a run of layers: ``__call__(x, layer, mod, queries, cached, mask, context, memory)
  -> (x, entries)``. ``layer`` is this layer's slice of the cache (``{"kv": ...}`` for softmax
  blocks, ``{"mem": ...}`` for hybrid ones, None entries without a cache); ``mod [B, M, 6, dim]`` the
  shared time modulation (shift, scale, gate for attention, then for the FFN), to which the block
  adds its own ``scale_shift_table``: one row per frame (``M = S``, each row modulating its frame's
  ``N`` tokens) or per token (``M = S*N``); per frame keeps it ``N`` times smaller than ``x``'s float32
  copy, which matters when every group of layers holds it and its gradient. A ``hybrid`` block (LOCI)
  attends to its own chunk and adds the gated readout of its recurrent memory (``memory``: per-token
  memory cameras and RoPE).
  """
  cfg: ModelConfig
  kind: str = "softmax"
  plan: object = None  # loci.MemoryPlan (static)

  @nn.compact
  def __call__(self, x, layer, mod, queries, cached, mask, context, memory):
    cfg = self.cfg
    table = self.param("scale_shift_table", nn.with_logical_partitioning(_table_init, (None, "modulation", "embed")),
                       (1, 6, cfg.dim))
    shift, scale, gate, c_shift, c_scale, c_gate = (a[:, :, 0, None] for a in jnp.split(table[None] + mod, 6, axis=2))
    b, length, dim = x.shape
    per, flat = _grouping(b, mod.shape[1], length, dim)
    dt = cfg.compute_dtype
    xf = per(x.astype(jnp.float32))
    y = flat((LayerNorm(cfg.eps, name="norm1")(xf) * (1 + scale) + shift).astype(dt))
    attn, own, selected = Attention(cfg, self.kind, name="attn1")(
        y, queries=queries, cached=cached, cache_kv=layer.get("kv"), mask=mask)
    if self.kind == "hybrid":
      state_in = layer.get("mem")
      state_in = memory["state"] if state_in is None else state_in
      read, state = loci_lib.RecurrentMemory(cfg, self.plan, name="memory")(y, memory["cam"], memory["rope"], state_in)
      mem_gate = self.param("mem_gate", _zeros(("embed",)), (cfg.dim,))
      attn = attn + (mem_gate * read.astype(jnp.float32)).astype(attn.dtype)
      entries = {"mem": state}
    else:
      entries = {"kv": own, "selected": selected}
    xf = xf + per(attn.astype(jnp.float32)) * gate
    if cfg.cross_attn:
      if cfg.cross_attn_norm:
        y = LayerNorm(cfg.eps, affine=True, name="norm2")(xf).astype(dt)
      else:  # diffusers: no norm before cross-attention
        y = xf.astype(dt)
      xf = xf + per(Attention(cfg, "cross", name="attn2")(flat(y), context=context).astype(jnp.float32))
    y = flat((LayerNorm(cfg.eps, name="norm3")(xf) * (1 + c_scale) + c_shift).astype(dt))
    y = dense(cfg.ffn_dim, ("embed", "mlp"), "ffn_in", dt)(y)
    y = dense(cfg.dim, ("mlp", "embed"), "ffn_out", dt)(nn.gelu(y, approximate=True))
    xf = xf + per(y.astype(jnp.float32)) * c_gate
    return nn.with_logical_constraint(flat(xf).astype(x.dtype), ("batch", "length", "act_embed")), entries


def _grouping(b, rows, length, dim):
  """``(per, flat)``: ``[B, L, D] <-> [B, rows, L / rows, D]``, tokens grouped by their modulation row."""
  if length % rows:
    raise ValueError(f"modulation rows {rows} must divide the sequence length {length}")
  return (lambda a: a.reshape(b, rows, length // rows, dim)), (lambda a: a.reshape(b, length, dim))


def patchify(latents, patch_size):
  """``[B, F, H, W, C] -> [B, F/pt * H/ph * W/pw, pt*ph*pw*C]`` (frame-major, then row-major)."""
  b, f, hh, ww, c = latents.shape
  pt, ph, pw = patch_size
  x = latents.reshape(b, f // pt, pt, hh // ph, ph, ww // pw, pw, c)
  x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7)
  return x.reshape(b, (f // pt) * (hh // ph) * (ww // pw), pt * ph * pw * c)


def unpatchify(tokens, shape, patch_size):
  """Inverse of :func:`patchify` for output channels: ``tokens [B, L, pt*ph*pw*C]`` -> ``[B, F, H, W, C]``."""
  b, f, hh, ww = shape
  pt, ph, pw = patch_size
  c = tokens.shape[-1] // (pt * ph * pw)
  x = tokens.reshape(b, f // pt, hh // ph, ww // pw, pt, ph, pw, c)
  return x.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, f, hh, ww, c)


def token_positions(frame_pos, grid_hw):
  """``[B, S]`` temporal positions -> ``[B, S*N, 3]`` ``(t, h, w)`` positions of every token."""
  gh, gw = grid_hw
  b, s = frame_pos.shape
  hh, ww = jnp.meshgrid(jnp.arange(gh, dtype=jnp.float32), jnp.arange(gw, dtype=jnp.float32), indexing="ij")
  t = jnp.broadcast_to(frame_pos.astype(jnp.float32)[:, :, None], (b, s, gh * gw))
  hw = jnp.broadcast_to(jnp.stack([hh.reshape(-1), ww.reshape(-1)], -1), (b, s, gh * gw, 2))
  return jnp.concatenate([t[..., None], hw], -1).reshape(b, s * gh * gw, 3)


class WanModel(nn.Module):
  """The DiT.

  ``__call__(latents, timesteps, frames=None, *, context=None, cache=None)``

  Args:
    latents: ``[B, S, h, w, C]`` frame sequence.
    timesteps: ``[B, S]`` per frame or ``[B, S*N]`` per token, Wan scale (0..1000).
    frames: :class:`jaxwm.models.conditioning.Frames` (positions, cameras, masks; default:
      positions ``0..S-1``, no cameras, dense). Camera-conditioned models need ``cameras``;
      frame-sparse and LOCI models need ``mask`` and ``local``, LOCI also ``plan``.
    context: ``[B, Lt, text_dim]`` conditioning sequence (when ``cross_attn``).
    cache: a :class:`jaxwm.models.cache.KVCache`, read but not written: raw keys of earlier frames
      are encoded at the slots' positions and cameras; ``frames.mask`` covers ``[slots; frames]``.

  Returns:
    ``(velocity [B, S, h, w, C_out] float32, Entries)``: this call's own cache entries
    (:class:`jaxwm.models.cache.Entries`: raw keys per softmax layer, LOCI's state after this
    call's writers per hybrid layer, frame-sparse selections). With the ``features`` collection mutable, the
    tokens after the blocks ``[B, S' * n, D]`` are sown as ``features/hidden`` (DMD2's GAN head reads them).
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, latents, timesteps, frames=None, *, context=None, cache=None):
    cfg, cc, enc = self.cfg, self.cfg.camera, self.cfg.encoding
    b, s, hh, ww, _ = latents.shape
    pt, ph, pw = cfg.patch_size
    if s % pt or hh % ph or ww % pw:
      raise ValueError(f"latents shape {latents.shape} is not divisible by model.patch_size {cfg.patch_size}")
    grid = (hh // ph, ww // pw)
    n = grid[0] * grid[1]
    s_tok = s // pt
    frames = Frames.sequence(b, s_tok) if frames is None else frames
    cams = frames.cameras
    x = dense(cfg.dim, ("patch", "embed"), "patch_embedding", cfg.compute_dtype)(
        patchify(latents.astype(cfg.compute_dtype), cfg.patch_size))
    poses = None
    if cfg.camera_conditioned:
      if cams is None:
        raise ValueError(f"model.camera ({cc.encoding}, plucker={cc.plucker}, loci={cfg.loci.enabled}) needs "
                         "frames.cameras")
      if cams.c2w.shape != (b, s, 4, 4) or cams.intrinsics.shape != (b, s, 3, 3):
        raise ValueError(f"cameras c2w {cams.c2w.shape} / intrinsics {cams.intrinsics.shape} must be "
                         f"{(b, s, 4, 4)} / {(b, s, 3, 3)}")
      poses = model_poses(cams.c2w, cc.translation_scale)
      if cc.plucker:  # ReWorld action injection, zero-initialised
        pl = plucker_tokens(poses, cams.intrinsics, (hh, ww), (ph, pw), cc.vae_stride)
        pl = nn.silu(dense(cfg.dim, ("patch", "embed"), "plucker_in", cfg.compute_dtype)(pl))
        x = x + nn.Dense(cfg.dim, name="plucker_out", dtype=cfg.compute_dtype, kernel_init=_zeros(("mlp", "embed")),
                         bias_init=_zeros(("embed",)))(pl)
    x = nn.with_logical_constraint(x, ("batch", "length", "act_embed"))
    if timesteps.shape not in ((b, s_tok), (b, s_tok * n)):  # per frame stays per frame (Block)
      raise ValueError(f"timesteps must have shape {(b, s_tok)} or {(b, s_tok * n)}; got {timesteps.shape}")
    temb, mod = TimeEmbedding(cfg.dim, cfg.freq_dim, name="condition_embedder")(timesteps)
    if cfg.cross_attn:
      if context is None:
        raise ValueError("model.cross_attn is on: pass context [B, Lt, text_dim]")
      context = TextProjection(cfg.dim, name="text_embedder")(context.astype(jnp.float32)).astype(cfg.compute_dtype)

    plan = ChannelPlan(cc, cfg.head_dim)
    enc_params = enc.model_params(cfg) if cfg.camera_conditioned else None

    def encoded(pos, c2w, intrinsics, with_cam=True):
      """:class:`Encoded` of frames at positions ``pos [B, F]`` with model poses ``c2w``."""
      r = rope3d_angles(token_positions(pos, grid), cfg.head_dim, cfg.rope_theta)
      if plan.replace:  # hw_low_replace: the camera channels lose their RoPE
        r = jnp.where(jnp.asarray(plan.pair_mask), 0.0, r)
      if c2w is None:
        return Encoded(r)
      offsets = enc.rope_offsets(cfg, enc_params, c2w)
      if offsets is not None:  # per frame -> per token, on the camera channels
        offsets = offsets * jnp.asarray(plan.pair_mask)
        f = pos.shape[1]
        offsets = jnp.broadcast_to(offsets[:, :, None], (b, f, n) + offsets.shape[2:]).reshape(
            (b, f * n) + offsets.shape[2:])
        r = r[:, :, None, :] + offsets
      return Encoded(r, enc.tensors(cc, c2w, intrinsics, grid, (ph, pw)) if with_cam else None)

    queries = encoded(frames.pos, poses, None if cams is None else cams.intrinsics)
    cached = None
    if cache is not None and cfg.num_softmax_layers:
      cache_poses = None if poses is None else model_poses(cache.cameras.c2w, cc.translation_scale)
      cached = encoded(cache.pos, cache_poses, cache.cameras.intrinsics, with_cam=not enc.per_view_keys)
    mask = self._attention_mask(frames, b, s_tok, n, 0 if cache is None else cache.max_frames)
    memory = None
    if cfg.loci.enabled:
      if frames.plan is None or len(frames.plan.chunk) != s_tok:
        raise ValueError(f"model.loci needs frames.plan (jaxwm.models.loci.MemoryPlan) with one entry per frame "
                         f"({s_tok}); got {None if frames.plan is None else len(frames.plan.chunk)}")
      zero_t = token_positions(jnp.zeros_like(frames.pos), grid)  # patch rotations only: no temporal RoPE
      memory = {"cam": loci_lib.memory_camera_tensors(cfg, cams.c2w, cams.intrinsics, grid, (ph, pw)),
                "rope": rope3d_angles(zero_t, cfg.head_dim, cfg.rope_theta),
                "state": jnp.zeros((b, cfg.num_heads, cfg.head_dim, cfg.head_dim), jnp.float32)}

    block = Block if cfg.remat == "none" else nn.remat(Block, policy=_REMAT[cfg.remat], prevent_cse=False)
    groups = cfg.layer_groups
    done = {"softmax": 0, "hybrid": 0}
    outs = {"kv": [], "selected": [], "mem": []}
    for kind, lo, hi in groups:
      length, first = hi - lo, done[kind]
      done[kind] += length
      layer = {}
      if cache is not None and kind == "softmax":
        layer["kv"] = {name: a[first:first + length] for name, a in cache.keys.items()}
      if cache is not None and kind == "hybrid" and cache.mem is not None:
        layer["mem"] = cache.mem[first:first + length]
      stack = nn.scan(block, variable_axes={"params": 0, "intermediates": 0},
                      split_rngs={"params": True, "frame_select": True},
                      in_axes=(0,) + (nn.broadcast,) * 6, length=length, unroll=min(cfg.scan_unroll, length),
                      metadata_params={nn.PARTITION_NAME: "layers"})(
                          cfg, kind, frames.plan, name="blocks" if len(groups) == 1 else f"blocks_{lo}_{hi}")
      x, entries = stack(x, layer, mod, queries, cached, mask, context, memory)
      for name, val in entries.items():
        if val is not None:
          outs[name].append(val)

    if self.is_mutable_collection("features") and not self.is_initializing():  # DMD2 GAN head's input (distill.gan)
      self.sow("features", "hidden", x)
    table = self.param("scale_shift_table", nn.with_logical_partitioning(_table_init, (None, "modulation", "embed")),
                       (1, 2, cfg.dim))
    shift, scale = (a[:, :, 0, None] for a in jnp.split(table[None] + temb[:, :, None], 2, axis=2))
    per, flat = _grouping(b, temb.shape[1], x.shape[1], cfg.dim)
    y = flat(LayerNorm(cfg.eps, name="norm_out")(per(x)) * (1 + scale) + shift)
    out = dense(cfg.out_channels * pt * ph * pw, ("embed", "patch"), "proj_out", cfg.compute_dtype)(
        y.astype(cfg.compute_dtype))
    cat = lambda xs: None if not xs else jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *xs)  # pylint: disable=unnecessary-lambda-assignment
    entries = Entries(keys=cat(outs["kv"]) or {}, mem=cat(outs["mem"]), selected=cat(outs["selected"]))
    return unpatchify(out.astype(jnp.float32), (b, s, hh, ww), cfg.patch_size), entries

  def _attention_mask(self, frames, b, s, n, cache_frames):
    """The :class:`AttentionMask` of ``frames`` over ``[cache_frames slots; s frames]`` keys."""
    cfg = self.cfg
    mask, local = frames.mask, frames.local
    needs_local = cfg.attention.sparse or cfg.loci.enabled
    if needs_local and (mask is None or local is None):
      raise ValueError(f"model.attention.sparsity={cfg.attention.sparsity!r} / model.loci.enabled="
                       f"{cfg.loci.enabled} need frames.mask and frames.local (each frame's own-chunk key frames)")
    if local is not None:
      local = jnp.broadcast_to(local, (b, s, local.shape[-1])).astype(jnp.int32)
    tokens = history = None
    if cfg.attention.sparse:
      if mask.ndim == 4:
        raise ValueError("per-head masks (head windows) are not supported with frame-sparse attention")
      mask = jnp.broadcast_to(mask, (b, s, mask.shape[-1]))
      history = mask & ~frame_sparse.indices_to_mask(local, mask.shape[-1])
    elif frames.static_mask is not None and cfg.num_softmax_layers and not cache_frames:
      static = frames.static_mask.with_tokens_per_frame(n)
      return AttentionMask(local=local, tokens_per_frame=n, static=static)
    elif mask is not None and cfg.num_softmax_layers:
      tokens = FrameMask(mask, n)  # the token mask, kept frame-level for the kernels
    return AttentionMask(tokens=tokens, history=history, local=local, tokens_per_frame=n, cache_frames=cache_frames)
