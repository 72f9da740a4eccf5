"""Camera encodings as transforms of head-channel ranges of q, k, v and the attention output.

Per token ``i`` (query) and ``j`` (key), on the configured channels (``jaxwm.encodings.channels``):

- **ViewRope** (ViewRope Eqs. 5-8): each channel triple of q and k is rotated by the token's
  ``R = R_c2w R_local(r)``; then ``<R_i q, R_j k> = q^T R_i^T R_j k`` (Eq. 8).
- **GTA** (Miyato et al.): 4-channel tiles, ``g = w2c`` (translation scaled):
  ``q <- g_i^T q``, ``k <- g_j^-1 k``, ``v <- g_j^-1 v``, ``out <- g_i out``; the logit is
  ``q^T g_i g_j^-1 k``, invariant to any common change of world coordinates.
- **PRoPE** (Li et al. 2025): GTA with ``g = P = lift(K_n) w2c`` (normalised intrinsics).
- Per-token GTA/PRoPE (LOCI, UCPE): ``w2c`` composed with the ray's local frame,
  ``g = lift(K_n) (c2w diag(R_local, 1))^-1``.
- **MRoPE** (ReWorld Eq. 1): pose phases added to the RoPE angles of q and k, plus
  zero-initialised SE(3) residuals on values and outputs (in ``jaxwm.models.transformer``).

These run after the backbone RoPE (the camera transform sits on top of it on shared channels).
"""

import jax.numpy as jnp
import numpy as np

from jaxwm.encodings.channels import channel_index, resolve_channels
from jaxwm.geometry.cameras import (lift_intrinsics, normalized_intrinsics, pixel_rays, plucker,
                                    token_pixel_centers)
from jaxwm.geometry.rotations import make_se3, rotation_z_to, se3_inverse


def viewrope_rotate(x, rot, idx):
  """Rotates the channel triples ``idx`` of ``x [B, L, H, D]`` by ``rot [B, L, 3, 3]`` (Eq. 7)."""
  sub = x[..., idx].astype(jnp.float32)
  sub = sub.reshape(sub.shape[:-1] + (len(idx) // 3, 3))
  out = jnp.einsum("blij,blhmj->blhmi", rot.astype(jnp.float32), sub)
  return x.at[..., idx].set(out.reshape(out.shape[:-2] + (len(idx),)).astype(x.dtype))


def tile_transform(x, mat, idx):
  """Applies ``mat [B, L, 4, 4]`` to the 4-channel tiles ``idx`` of ``x [B, L, H, D]``: ``t <- mat t``."""
  sub = x[..., idx].astype(jnp.float32)
  sub = sub.reshape(sub.shape[:-1] + (len(idx) // 4, 4))
  out = jnp.einsum("blij,blhmj->blhmi", mat.astype(jnp.float32), sub)
  return x.at[..., idx].set(out.reshape(out.shape[:-2] + (len(idx),)).astype(x.dtype))


def _per_token(a, n):
  """``[B, S, ...]`` per frame -> ``[B, S * n, ...]`` per token."""
  return jnp.repeat(a, n, axis=1)


def _scaled_c2w(c2w, scale):
  """Multiplies translations by ``scale [B]`` (broadcast over frames)."""
  t = c2w[..., :3, 3] * scale[:, None, None]
  return make_se3(c2w[..., :3, :3], t)


def camera_tensors(cam_cfg, c2w, intrinsics, scale, grid_hw, patch_hw):
  """Per-token matrices the attention needs for ``cam_cfg.encoding``.

  Args:
    cam_cfg: ``CameraConfig``.
    c2w: ``[B, S, 4, 4]`` (re-anchored); intrinsics: ``[B, S, 3, 3]`` in pixels; scale: ``[B]``
      translation multipliers (``translation_scale`` is applied on top).
    grid_hw: token grid ``(h', w')``; patch_hw: ``(ph, pw)``.

  Returns:
    dict with ``rot [B, L, 3, 3]`` (ViewRope) or ``g, g_inv [B, L, 4, 4]`` (GTA, PRoPE, MRoPE).
  """
  enc = cam_cfg.encoding
  n = grid_hw[0] * grid_hw[1]
  stride = (cam_cfg.vae_stride, cam_cfg.vae_stride)
  c2w = c2w.astype(jnp.float32)
  k = intrinsics.astype(jnp.float32)
  if enc == "worldrope":
    c2w_s = _scaled_c2w(c2w, scale * cam_cfg.translation_scale)
    uv = token_pixel_centers(grid_hw, patch_hw, stride, xp=jnp).reshape(n, 2)
    s = c2w.shape[1]
    return {"uv": jnp.tile(uv, (s, 1)), "key_c2w": _per_token(c2w_s, n), "key_k": _per_token(k, n),
            "q_c2w": c2w_s, "q_k": k}
  if enc == "viewrope":
    rays = pixel_rays(k, token_pixel_centers(grid_hw, patch_hw, stride, xp=jnp))  # [B, S, h', w', 3]
    r_local = rotation_z_to(rays).reshape(rays.shape[:2] + (n, 3, 3))
    rot = c2w[:, :, None, :3, :3] @ r_local
    return {"rot": rot.reshape((rot.shape[0], -1, 3, 3))}
  c2w = _scaled_c2w(c2w, scale * cam_cfg.translation_scale)
  if enc in ("gta", "prope") and cam_cfg.per_token:
    rays = pixel_rays(k, token_pixel_centers(grid_hw, patch_hw, stride, xp=jnp))
    r_local = rotation_z_to(rays).reshape(rays.shape[:2] + (n, 3, 3))
    local = make_se3(r_local, jnp.zeros(r_local.shape[:-1]))
    c2w_tok = c2w[:, :, None] @ local  # [B, S, N, 4, 4]
    w2c, c2w_flat = se3_inverse(c2w_tok), c2w_tok
    k_tok = jnp.broadcast_to(k[:, :, None], c2w_tok.shape[:3] + (3, 3))
  else:
    w2c, c2w_flat, k_tok = se3_inverse(c2w), c2w, k
  if enc == "prope":
    image_hw = (grid_hw[0] * patch_hw[0] * stride[0], grid_hw[1] * patch_hw[1] * stride[1])
    kn = normalized_intrinsics(k_tok, image_hw)
    g = lift_intrinsics(kn) @ w2c
    g_inv = c2w_flat @ lift_intrinsics(jnp.linalg.inv(kn))
  else:  # gta, mrope
    g, g_inv = w2c, c2w_flat
  if g.ndim == 5:  # per token
    g, g_inv = g.reshape((g.shape[0], -1, 4, 4)), g_inv.reshape((g.shape[0], -1, 4, 4))
  else:
    g, g_inv = _per_token(g, n), _per_token(g_inv, n)
  return {"g": g, "g_inv": g_inv}


def pose_descriptor(c2w, scale):
  """MRoPE's ``c_f = [vec(R_f); t_f * scale]`` in ``R^12``: ``[B, S, 4, 4] -> [B, S, 12]``."""
  rot = c2w[..., :3, :3].reshape(c2w.shape[:-2] + (9,))
  return jnp.concatenate([rot, c2w[..., :3, 3] * scale[:, None, None]], -1).astype(jnp.float32)


def trajectory_scale(c2w, eps=1e-6):
  """``1 / max_f |t_f|`` of re-anchored cameras ``[B, F, 4, 4]`` (MRoPE's radius normalisation), 1 if static."""
  radius = jnp.max(jnp.linalg.norm(c2w[..., :3, 3], axis=-1), axis=-1)
  return jnp.where(radius > eps, 1.0 / jnp.maximum(radius, eps), 1.0)


def plucker_tokens(c2w, intrinsics, scale, latent_hw, patch_hw, vae_stride):
  """Per-latent-pixel Plücker rays (translations scaled), patchified: ``[B, L, 6 * ph * pw]``."""
  h, w = latent_hw
  uv = token_pixel_centers((h, w), (1, 1), (vae_stride, vae_stride), xp=jnp)
  pl = plucker(_scaled_c2w(c2w.astype(jnp.float32), scale), intrinsics.astype(jnp.float32), uv)  # [B,S,h,w,6]
  b, s = pl.shape[:2]
  ph, pw = patch_hw
  pl = pl.reshape(b, s, h // ph, ph, w // pw, pw, 6).transpose(0, 1, 2, 4, 3, 5, 6)
  return pl.reshape(b, s * (h // ph) * (w // pw), ph * pw * 6)


class ChannelPlan:
  """Static channel bookkeeping of a model's camera encoding (hashable config -> index arrays)."""

  def __init__(self, cam_cfg, head_dim):
    self.encoding = cam_cfg.encoding
    if self.encoding == "rope3d":
      self.idx, self.replace = [], False
    else:
      ranges, self.replace = resolve_channels(cam_cfg.channels, head_dim, self.encoding)
      self.idx = channel_index(ranges)
    pair_mask = np.zeros(head_dim // 2, bool)
    for c in self.idx:
      pair_mask[c // 2] = True
    self.pair_mask = pair_mask  # RoPE pairs touched by the camera channels
