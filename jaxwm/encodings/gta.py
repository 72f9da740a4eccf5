"""GTA (Miyato et al. 2024; ViewRope's baseline; docs/design.md §4).

Per camera an SE(3) matrix ``g = w2c`` acts on 4-channel tiles: ``q <- g_i^T q``,
``k <- g_j^-1 k``, ``v <- g_j^-1 v``, ``out <- g_i out``. The logit is ``q^T g_i g_j^-1 k``,
invariant to any common rigid change of world coordinates. ``model.camera.per_token`` composes
``w2c`` with each token's ray frame (one transform per token, as LOCI and UCPE do).
"""

import flax
import jax
import jax.numpy as jnp

from jaxwm.encodings.base import CameraEncoding, per_token, ray_frames, tile_transform
from jaxwm.geometry.rotations import make_se3, se3_inverse


@flax.struct.dataclass
class TileTensors:
  """``g, g_inv [B, L, 4, 4]`` per token."""
  g: jax.Array
  g_inv: jax.Array


class GTA(CameraEncoding):
  """GTA: SE(3) tiles on q, k, v and the output."""
  name = "gta"
  unit = 4

  def camera_frames(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    """``(c2w, intrinsics)`` per frame ``[B, S, ...]``, or per token ``[B, S, N, ...]`` when ``per_token``."""
    if not cam_cfg.per_token:
      return c2w, intrinsics
    r_local = ray_frames(intrinsics, grid_hw, patch_hw, cam_cfg.vae_stride)
    c2w_tok = c2w[:, :, None] @ make_se3(r_local, jnp.zeros(r_local.shape[:-1]))
    return c2w_tok, jnp.broadcast_to(intrinsics[:, :, None], c2w_tok.shape[:3] + (3, 3))

  def matrices(self, cam_cfg, c2w, intrinsics, latent_hw):
    """``(g, g_inv)`` of cameras ``c2w`` (any leading shape)."""
    return se3_inverse(c2w), c2w

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    c2w, k = self.camera_frames(cam_cfg, c2w, intrinsics.astype(jnp.float32), grid_hw, patch_hw)
    g, g_inv = self.matrices(cam_cfg, c2w, k, (grid_hw[0] * patch_hw[0], grid_hw[1] * patch_hw[1]))
    if g.ndim == 5:  # per token
      return TileTensors(g.reshape((g.shape[0], -1, 4, 4)), g_inv.reshape((g.shape[0], -1, 4, 4)))
    n = grid_hw[0] * grid_hw[1]
    return TileTensors(per_token(g, n), per_token(g_inv, n))

  def encode_q(self, q, cam, plan):
    return tile_transform(q, jnp.swapaxes(cam.g, -1, -2), plan.idx)

  def encode_kv(self, k, v, cam, plan, params):
    return tile_transform(k, cam.g_inv, plan.idx), tile_transform(v, cam.g_inv, plan.idx)

  def decode(self, out, cam, plan, params):
    return tile_transform(out, cam.g, plan.idx), None


ENCODING = GTA()
