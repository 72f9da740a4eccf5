"""Wan 2.x-style DiT in Flax Linen (DESIGN §2, §4; diffusers' ``WanTransformer3DModel``).

Frames in, velocity out, over a *frame sequence* ``[B, S, h, w, C]`` that may mix clean and
noisy frames (the teacher-forcing layout) or be one chunk attending to a KV cache (streaming).
Per frame (or per token) timesteps, temporal RoPE positions and a frame-level attention mask
say which is which; see ``jaxwm.training.layout`` and ``jaxwm.sampling``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.encodings import camera as cam_lib
from jaxwm.encodings import worldrope as wr_lib
from jaxwm.encodings.rope3d import apply_rotary, rope3d_angles
from jaxwm.models.config import ModelConfig
from jaxwm.models import loci as loci_lib
from jaxwm.models.embeddings import TextProjection, TimeEmbedding
from jaxwm.models.layers import LayerNorm, RMSNorm, dense
from jaxwm.ops import frame_sparse
from jaxwm.ops.attention import attention_weights, dot_product_attention

_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _table_init(key, shape, dtype=jnp.float32):
  """Wan's modulation table init: ``randn / sqrt(dim)``."""
  return jax.random.normal(key, shape, dtype) / shape[-1] ** 0.5


def _constrain(x, axes):
  return nn.with_logical_constraint(x, axes)


def _encode_kv(k, v, rope, cam, enc, plan, mrope_v=None):
  """Temporal/spatial RoPE and the camera transform of keys (and values, for GTA/PRoPE/MRoPE)
  of raw ``k, v [B, L, H, D]`` at their frames' ``rope`` angles and camera tensors ``cam``."""
  k = apply_rotary(k, rope)
  if enc == "viewrope":
    k = cam_lib.viewrope_rotate(k, cam["rot"], plan.idx)
  elif enc in ("gta", "prope"):
    k = cam_lib.tile_transform(k, cam["g_inv"], plan.idx)
    v = cam_lib.tile_transform(v, cam["g_inv"], plan.idx)
  elif enc == "mrope":
    v = v + mrope_v(cam_lib.tile_transform(v, cam["g_inv"], plan.idx)[..., plan.idx])
  return k, v


class Attention(nn.Module):
  """Multi-head attention with q/k RMSNorm across heads (Wan).

  Self-attention: ``__call__(x, rope={"q": angles, "cache": angles}, mask=..., cache={"k", "v", ...},
  cam={"q": tensors, "cache": tensors})`` returns the output and this call's own cache entries
  ``{"k", "v", ...}``. Cached keys and values are *raw* (after the q/k norm, before any
  position or camera transform): the transforms of their frames (``rope["cache"]``,
  ``cam["cache"]``) are applied when they are read, so a memory policy may give retained frames
  new (compact) temporal positions. WorldRoPE adds each key's Gaussians (``wr_mean``,
  ``wr_cov``, ``wr_alpha``). ``mask`` is a token-level bool mask (dense), or for frame-sparse
  attention a dict ``{"history": [B, Sq, Sk] bool, "local": [B, Sq, C] int}`` (see
  :class:`WanModel`); the selected frames are then returned as ``selected [B, Sq, k]``.
  Cross-attention: ``__call__(x, context=ctx)``.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, *, context=None, rope=None, mask=None, cache=None, cam=None):
    cfg = self.cfg
    h, d = cfg.num_heads, cfg.head_dim
    dt = cfg.compute_dtype
    src = x if context is None else context
    q = RMSNorm(cfg.eps, name="norm_q")(dense(cfg.dim, ("embed", "heads"), "to_q", dt)(x))
    k = RMSNorm(cfg.eps, name="norm_k")(dense(cfg.dim, ("embed", "heads"), "to_k", dt)(src))
    v = dense(cfg.dim, ("embed", "heads"), "to_v", dt)(src)
    q, k, v = (a.reshape(a.shape[:2] + (h, d)) for a in (q, k, v))
    if context is not None:  # cross-attention: no positions, no cameras
      out = dot_product_attention(q, k, v, None, impl=cfg.attention_impl)
      return dense(cfg.dim, ("heads", "embed"), "to_out", dt)(out.reshape(out.shape[:2] + (cfg.dim,))), {}
    enc = cfg.camera.encoding if cam is not None else "rope3d"
    plan = cam_lib.ChannelPlan(cfg.camera, d)
    if enc == "worldrope":
      return self._worldrope(x, q, k, v, rope, mask, cache, cam, plan)
    mrope_v = None
    if enc == "mrope":  # v' = v + W_v (P^-1 . v), zero-initialised (ReWorld Eq. 1)
      mrope_v = nn.Dense(d, name="mrope_v", dtype=cfg.compute_dtype, use_bias=False, kernel_init=nn.with_logical_partitioning(
          nn.initializers.zeros_init(), (None, None)))
    cam_q = None if cam is None else cam["q"]
    own = {"k": k, "v": v}
    q = apply_rotary(q, rope["q"])
    if enc == "viewrope":
      q = cam_lib.viewrope_rotate(q, cam_q["rot"], plan.idx)
    elif enc in ("gta", "prope"):
      q = cam_lib.tile_transform(q, jnp.swapaxes(cam_q["g"], -1, -2), plan.idx)
    k, v = _encode_kv(k, v, rope["q"], cam_q, enc, plan, mrope_v)
    if cache is not None:
      kc, vc = _encode_kv(cache["k"].astype(k.dtype), cache["v"].astype(v.dtype), rope["cache"],
                          None if cam is None else cam["cache"], enc, plan, mrope_v)
      k, v = jnp.concatenate([kc, k], axis=1), jnp.concatenate([vc, v], axis=1)
    q = _constrain(q, ("batch", "length", "act_heads", "act_kv"))
    if isinstance(mask, dict):
      out, own["selected"] = self._sparse(q, k, v, mask)
    else:
      out = dot_product_attention(q, k, v, mask, impl=cfg.attention_impl)
    if self.is_mutable_collection("intermediates"):  # analysis only: apply(..., mutable=["intermediates"])
      self._sow_weights(q, k, mask, own.get("selected"))
    extra = None
    if enc in ("gta", "prope"):
      out = cam_lib.tile_transform(out, cam_q["g"], plan.idx)
    elif enc == "mrope":  # out = W_o y + W_p (P . y), W_p zero-initialised
      py = cam_lib.tile_transform(out, cam_q["g"], plan.idx)[..., plan.idx]
      extra = nn.Dense(cfg.dim, name="mrope_out", dtype=dt, use_bias=False, kernel_init=nn.with_logical_partitioning(
          nn.initializers.zeros_init(), (None, "embed")))(py.reshape(py.shape[:2] + (-1,)))
    out = dense(cfg.dim, ("heads", "embed"), "to_out", dt)(out.reshape(out.shape[:2] + (cfg.dim,)))
    return (out if extra is None else out + extra), own

  def _sow_weights(self, q, k, mask, selected):
    """Sows the head-averaged attention weights ``[B, Lq, Lk]`` as ``intermediates/.../attn_weights``; for
    frame-sparse attention the keys are the selected and own-chunk frames."""
    if isinstance(mask, dict):
      n = q.shape[1] // mask["local"].shape[1]
      fk = k.shape[1] // n
      frames = (frame_sparse.indices_to_mask(selected, fk) | frame_sparse.indices_to_mask(mask["local"], fk))
      mask = expand_frame_mask(frames, n)
    self.sow("intermediates", "attn_weights", attention_weights(q, k, mask).mean(axis=1))

  def _sparse(self, q, k, v, mask):
    """Frame-sparse attention (ViewRope Alg. 1): select history frames, attend to them and the own chunk."""
    ac = self.cfg.attention
    n = q.shape[1] // mask["local"].shape[1]
    key = self.make_rng("frame_select") if self.has_rng("frame_select") else None
    select_key = None
    if ac.selection != "topk":
      if key is None:
        raise ValueError(f"model.attention.selection={ac.selection!r} needs rngs={{'frame_select': key}}")
      key, select_key = jax.random.split(key)
    return frame_sparse.frame_sparse_attention(
        q, k, v, tokens_per_frame=n, history=mask["history"], local_idx=mask["local"], top_k=ac.top_k,
        sparsity=ac.sparsity, num_samples=ac.num_samples, window=ac.window, mode=ac.selection, key=key,
        select_key=select_key, impl=ac.impl, interpret=ac.interpret)

  def _worldrope(self, x, q, k, v, rope, mask, cache, cam, plan):
    """WorldRoPE self-attention (``jaxwm.encodings.worldrope``): per-query-view keys."""
    cfg, cc = self.cfg, self.cfg.camera
    cam = cam["q"]
    keep = jnp.asarray(~plan.pair_mask, jnp.float32)
    q = apply_rotary(q, rope["q"])
    m = cc.hypotheses
    raw = nn.Dense(3 * m, name="depth_head", kernel_init=nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ("embed", None)), bias_init=nn.with_logical_partitioning(
            nn.initializers.zeros_init(), (None,)))(x.astype(jnp.float32))
    pixels = cfg.patch_size[1] * cc.vae_stride
    gauss = wr_lib.key_gaussians(raw, cam["uv"], cam["key_k"], cam["key_c2w"], pixels,
                                 jnp.linspace(cc.depth_range[0], cc.depth_range[1], m))
    own = {"k": k, "v": v, **{f"wr_{name}": a for name, a in gauss.items()}}
    own_all = dict(own, k=apply_rotary(k, rope["q"] * keep))  # keys: time RoPE only, at their positions
    if cache is not None:
      cached = dict(cache, k=apply_rotary(cache["k"].astype(k.dtype), rope["cache"] * keep))
      own_all = {name: jnp.concatenate([cached[name].astype(a.dtype), a], axis=1) for name, a in own_all.items()}
    pairs = sorted({c // 2 for c in plan.idx})
    freqs = wr_lib.hw_frequencies(cfg.head_dim, pairs, cfg.rope_theta, cc.mixed_frequencies)
    k_views = wr_lib.transform_keys(own_all["k"], {n: own_all[f"wr_{n}"] for n in ("mean", "cov", "alpha")},
                                    cam["q_k"], cam["q_c2w"], freqs, pairs, pixels)
    n_tok = q.shape[1] // cam["q_k"].shape[1]
    out = wr_lib.per_view_attention(q, k_views, own_all["v"], mask, n_tok)
    out = dense(cfg.dim, ("heads", "embed"), "to_out", cfg.compute_dtype)(out.reshape(out.shape[:2] + (cfg.dim,)))
    return out, own


class Block(nn.Module):
  """One DiT block: modulated self-attention, optional cross-attention, modulated GELU-tanh FFN.

  Scanned over layers: ``__call__(x, layer, mod, rope, mask, context, cam, mem) -> (x, own cache entries)``
  with ``layer = {"cache": this layer's cache or None, "hybrid": 1.0 for a LOCI hybrid block}``.
  ``mod [B, L, 6, dim]`` is the shared time modulation (shift, scale, gate for attention,
  then for the FFN), to which the block adds its own ``scale_shift_table``. With ``model.loci``
  every block carries the memory parameters; in hybrid blocks softmax attention sees the own
  chunk only (``mem["local"]``) and the gated memory readout is added, elsewhere the memory
  is multiplied by zero.
  """
  cfg: ModelConfig
  plan: object = None  # loci.MemoryPlan (static)

  @nn.compact
  def __call__(self, x, layer, mod, rope, mask, context, cam, mem):
    cfg = self.cfg
    cache, hybrid = layer["cache"], layer["hybrid"]
    table = self.param("scale_shift_table",
                       nn.with_logical_partitioning(_table_init, (None, "modulation", "embed")), (1, 6, cfg.dim))
    shift, scale, gate, c_shift, c_scale, c_gate = jnp.split(table[None] + mod, 6, axis=2)
    shift, scale, gate, c_shift, c_scale, c_gate = (a[:, :, 0] for a in (shift, scale, gate, c_shift, c_scale, c_gate))
    dt = cfg.compute_dtype
    xf = x.astype(jnp.float32)
    y = (LayerNorm(cfg.eps, name="norm1")(xf) * (1 + scale) + shift).astype(dt)
    if cfg.loci.enabled:  # hybrid blocks: softmax over the own chunk only
      on = hybrid > 0
      if isinstance(mask, dict):
        mask = {**mask, "history": mask["history"] & ~on}
      else:
        mask = jnp.where(on, mem["local"] if mask.ndim == 3 else mem["local"][:, None], mask)
    attn, kv = Attention(cfg, name="attn1")(y, rope=rope, mask=mask, cache=cache, cam=cam)
    if cfg.loci.enabled:
      state_in = mem["state"] if cache is None or "mem" not in cache else cache["mem"]
      read, state = loci_lib.RecurrentMemory(cfg, self.plan, name="memory")(y, mem["cam"], mem["rope"], state_in)
      mem_gate = self.param("mem_gate", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
                            (cfg.dim,))
      attn = attn + (hybrid * mem_gate * read.astype(jnp.float32)).astype(attn.dtype)
      kv["mem"] = jnp.where(hybrid > 0, state, state_in)
    xf = xf + attn.astype(jnp.float32) * gate
    if cfg.cross_attn:
      y = LayerNorm(cfg.eps, affine=cfg.cross_attn_norm, name="norm2")(xf).astype(dt)
      xf = xf + Attention(cfg, name="attn2")(y, context=context)[0].astype(jnp.float32)
    y = (LayerNorm(cfg.eps, name="norm3")(xf) * (1 + c_scale) + c_shift).astype(dt)
    y = dense(cfg.ffn_dim, ("embed", "mlp"), "ffn_in", dt)(y)
    y = dense(cfg.dim, ("mlp", "embed"), "ffn_out", dt)(nn.gelu(y, approximate=True))
    xf = xf + y.astype(jnp.float32) * c_gate
    return _constrain(xf.astype(x.dtype), ("batch", "length", "act_embed")), kv


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


def expand_frame_mask(mask, tokens_per_frame):
  """Frame-level ``[B, (H,) Sq, Sk]`` bool mask -> token-level ``[B, (H,) Sq*N, Sk*N]``."""
  *lead, sq, sk = mask.shape
  n = tokens_per_frame
  m = jnp.broadcast_to(mask[..., :, None, :, None], (*lead, sq, n, sk, n))
  return m.reshape(*lead, sq * n, sk * n)


class WanModel(nn.Module):
  """The DiT.

  ``__call__(latents, timesteps, *, frame_pos=None, mask=None, context=None, cache=None, cameras=None, local=None)``

  Args:
    latents: ``[B, S, h, w, C]`` frame sequence.
    timesteps: ``[B, S]`` per frame or ``[B, S*N]`` per token, Wan scale (0..1000).
    frame_pos: ``[B, S]`` temporal RoPE positions (default ``0..S-1``).
    mask: frame-level bool ``[B, S, S_cache + S]`` (True = attend), or per head
      ``[B, H, S, S_cache + S]`` (ReWorld's head windows), or None (dense).
    context: ``[B, Lt, text_dim]`` conditioning sequence (used when ``cross_attn``).
    cache: ``{"k": ..., "v": ..., ...}`` with ``[num_layers, B, S_cache*N, H, Dh]`` raw keys/values
      of earlier frames (encoded when read, see :class:`Attention`), read but not written
      (WorldRoPE adds each key's Gaussians).
    cache_frames: with a cache, ``{"pos": [B, S_cache]}`` temporal positions of the cached frames
      (a memory policy may compact them) and, for camera-conditioned models, their ``c2w``
      and ``intrinsics``.
    cameras: dict with ``c2w [B, S, 4, 4]`` (re-anchored on the clip's first frame),
      ``intrinsics [B, S, 3, 3]`` (pixels of the frames), optional ``scale [B]`` (translation
      multiplier, e.g. ``trajectory_scale`` of the whole trajectory); required when the model
      is camera-conditioned (``model.camera``).
    local: frame-sparse attention (``model.attention.sparsity != "dense"``): ``[B, S, C]`` int,
      the key frames (indices into ``[cache frames; these frames]``) each frame always attends,
      its own chunk (Eq. 11), -1 pads; the other frames allowed by ``mask`` are the history
      it selects from. The rng stream ``frame_select`` (optional) samples Eq. 9's positions.
      ``model.loci`` uses ``local`` too: hybrid blocks attend to those frames only.
    memory_plan: ``model.loci``: a static :class:`jaxwm.models.loci.MemoryPlan` (chunk and
      writer flag per frame); the incoming delta-rule state is ``cache["mem"]``
      ``[num_layers, B, H, Dh, Dh]`` (zeros without a cache).

  Returns:
    ``(velocity [B, S, h, w, C_out] float32, entries)`` with this call's own cache entries per
    layer, ``{"k", "v": [num_layers, B, S*N, H, Dh], ...}`` (what a streaming commit stores);
    with frame-sparse attention also ``selected [num_layers, B, S, k]``, the history frames
    each frame attended (-1 pads); with ``model.loci`` also ``mem``, the state after this
    call's writers (unchanged in non-hybrid blocks).
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, latents, timesteps, *, frame_pos=None, mask=None, context=None, cache=None, cameras=None,
               local=None, memory_plan=None, cache_frames=None):
    cfg = self.cfg
    b, s, hh, ww, _ = latents.shape
    pt, ph, pw = cfg.patch_size
    if s % pt or hh % ph or ww % pw:
      raise ValueError(f"latents shape {latents.shape} is not divisible by model.patch_size {cfg.patch_size}")
    grid = (hh // ph, ww // pw)
    n = grid[0] * grid[1]
    s_tok = s // pt
    if frame_pos is None:
      frame_pos = jnp.broadcast_to(jnp.arange(s_tok, dtype=jnp.float32), (b, s_tok))
    x = dense(cfg.dim, ("patch", "embed"), "patch_embedding", cfg.compute_dtype)(
        patchify(latents.astype(cfg.compute_dtype), cfg.patch_size))
    cam_cfg = cfg.camera
    cam = None
    if cfg.camera_conditioned:
      if cameras is None:
        raise ValueError(f"model.camera ({cam_cfg.encoding}, plucker={cam_cfg.plucker}) needs cameras "
                         "{'c2w', 'intrinsics'}")
      c2w, intr = cameras["c2w"], cameras["intrinsics"]
      if c2w.shape != (b, s, 4, 4) or intr.shape != (b, s, 3, 3):
        raise ValueError(f"cameras c2w {c2w.shape} / intrinsics {intr.shape} must be {(b, s, 4, 4)} / {(b, s, 3, 3)}")
      scale = cameras.get("scale")
      scale = jnp.ones((b,), jnp.float32) if scale is None else scale
      if cam_cfg.encoding != "rope3d":
        cam = cam_lib.camera_tensors(cam_cfg, c2w, intr, scale, grid, (ph, pw))
      if cam_cfg.plucker:  # ReWorld action injection, zero-initialised
        pl = cam_lib.plucker_tokens(c2w, intr, scale, (hh, ww), (ph, pw), cam_cfg.vae_stride)
        pl = nn.silu(dense(cfg.dim, ("patch", "embed"), "plucker_in", cfg.compute_dtype)(pl))
        x = x + nn.Dense(cfg.dim, name="plucker_out", dtype=cfg.compute_dtype, kernel_init=nn.with_logical_partitioning(
            nn.initializers.zeros_init(), ("mlp", "embed")), bias_init=nn.with_logical_partitioning(
                nn.initializers.zeros_init(), ("embed",)))(pl)
    x = _constrain(x, ("batch", "length", "act_embed"))
    if timesteps.shape == (b, s_tok):
      timesteps = jnp.repeat(timesteps, n, axis=1)
    if timesteps.shape != (b, s_tok * n):
      raise ValueError(f"timesteps must have shape {(b, s_tok)} or {(b, s_tok * n)}; got {timesteps.shape}")
    temb, mod = TimeEmbedding(cfg.dim, cfg.freq_dim, name="condition_embedder")(timesteps)
    if cfg.cross_attn:
      if context is None:
        raise ValueError("model.cross_attn is on: pass context [B, Lt, text_dim]")
      context = TextProjection(cfg.dim, name="text_embedder")(context.astype(jnp.float32)).astype(cfg.compute_dtype)
    plan = cam_lib.ChannelPlan(cam_cfg, cfg.head_dim)
    mrope_mlp = None
    if cam_cfg.encoding == "mrope":  # pose phases (ReWorld Eq. 1), zero-initialised MLP, on the camera channels
      mrope_mlp = (dense(cam_cfg.mrope_hidden, (None, "mlp"), "mrope_mlp_in", jnp.float32),
                   nn.Dense(cfg.num_heads * cfg.head_dim // 2, name="mrope_mlp_out",
                            kernel_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp", "heads")),
                            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads",))))

    def frame_rope(pos, c2w):
      """RoPE angles ``[B, F*N, (H,) D/2]`` of frames at temporal positions ``pos [B, F]``."""
      r = rope3d_angles(token_positions(pos, grid), cfg.head_dim, cfg.rope_theta)
      if plan.replace:  # hw_low_replace: the camera channels lose their RoPE
        r = jnp.where(jnp.asarray(plan.pair_mask), 0.0, r)
      if mrope_mlp is not None:
        f = pos.shape[1]
        delta = mrope_mlp[1](nn.silu(mrope_mlp[0](cam_lib.pose_descriptor(c2w, scale))))
        delta = delta.reshape(b, f, 1, cfg.num_heads, cfg.head_dim // 2) * jnp.asarray(plan.pair_mask)
        delta = jnp.broadcast_to(delta, (b, f, n, cfg.num_heads, cfg.head_dim // 2))
        r = r[:, :, None, :] + delta.reshape(b, f * n, cfg.num_heads, cfg.head_dim // 2)
      return r

    rope = {"q": frame_rope(frame_pos, None if cameras is None else cameras["c2w"])}
    if cam is not None:
      cam = {"q": cam}
    if cache is not None:
      if cache_frames is None:
        raise ValueError("a cache needs cache_frames {'pos' [B, M], and for camera-conditioned models 'c2w', "
                         "'intrinsics'}: cached keys are encoded at their frames' positions when read")
      rope["cache"] = frame_rope(cache_frames["pos"], cache_frames.get("c2w"))
      if cam is not None and cam_cfg.encoding != "worldrope":
        cam["cache"] = cam_lib.camera_tensors(cam_cfg, cache_frames["c2w"], cache_frames["intrinsics"], scale, grid,
                                              (ph, pw))
    mem = None
    if cfg.loci.enabled:
      if mask is None or local is None or memory_plan is None:
        raise ValueError("model.loci needs the frame mask, `local` (each frame's own-chunk key frames) and a "
                         "`memory_plan` (jaxwm.models.loci.MemoryPlan)")
      if len(memory_plan.chunk) != s_tok:
        raise ValueError(f"memory_plan has {len(memory_plan.chunk)} frames; the sequence has {s_tok}")
      own = frame_sparse.indices_to_mask(jnp.broadcast_to(local, (b, s_tok, local.shape[-1])), mask.shape[-1])
      zero_t = token_positions(jnp.zeros_like(frame_pos), grid)  # patch rotations only: no temporal RoPE
      mem = {"local": None if cfg.attention.sparse else expand_frame_mask(own, n),
             "cam": loci_lib.memory_camera_tensors(cfg, cameras["c2w"], cameras["intrinsics"], grid, (ph, pw)),
             "rope": rope3d_angles(zero_t, cfg.head_dim, cfg.rope_theta),
             "state": jnp.zeros((b, cfg.num_heads, cfg.head_dim, cfg.head_dim), jnp.float32)}
    if cfg.attention.sparse:
      if mask is not None and mask.ndim == 4:
        raise ValueError("per-head masks (head windows) are not supported with frame-sparse attention")
      if mask is None or local is None:
        raise ValueError(f"model.attention.sparsity={cfg.attention.sparsity!r} needs the frame mask and `local` "
                         "(each frame's own-chunk key frames)")
      local = jnp.broadcast_to(local, (b, s_tok, local.shape[-1])).astype(jnp.int32)
      mask = jnp.broadcast_to(mask, (b, s_tok, mask.shape[-1]))
      tok_mask = {"history": mask & ~frame_sparse.indices_to_mask(local, mask.shape[-1]), "local": local}
    else:
      tok_mask = None if mask is None else expand_frame_mask(mask, n)

    block = Block
    if cfg.remat != "none":
      block = nn.remat(Block, policy=_REMAT[cfg.remat], prevent_cse=False)
    blocks = nn.scan(block, variable_axes={"params": 0, "intermediates": 0},
                     split_rngs={"params": True, "frame_select": True},
                     in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                     length=cfg.num_layers, unroll=cfg.scan_unroll,
                     metadata_params={nn.PARTITION_NAME: "layers"})(cfg, memory_plan, name="blocks")
    hybrid = jnp.asarray([float(i in cfg.loci.blocks and cfg.loci.enabled) for i in range(cfg.num_layers)])
    x, kv = blocks(x, {"cache": cache, "hybrid": hybrid}, mod, rope, tok_mask, context, cam, mem)

    table = self.param("scale_shift_table",
                       nn.with_logical_partitioning(_table_init, (None, "modulation", "embed")), (1, 2, cfg.dim))
    shift, scale = jnp.split(table[None] + temb[:, :, None], 2, axis=2)
    y = LayerNorm(cfg.eps, name="norm_out")(x) * (1 + scale[:, :, 0]) + shift[:, :, 0]
    out = dense(cfg.out_channels * pt * ph * pw, ("embed", "patch"), "proj_out", cfg.compute_dtype)(
        y.astype(cfg.compute_dtype))
    return unpatchify(out.astype(jnp.float32), (b, s, hh, ww), cfg.patch_size), kv
