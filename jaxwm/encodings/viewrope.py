"""ViewRope (ViewRope Eqs. 5-8; docs/design.md §4).

Each channel triple of q and k is rotated by the token's ``R = R_c2w R_local(r)`` (``R_local``
takes +z to the token's viewing ray, Eq. 5), so ``<R_i q, R_j k> = q^T R_i^T R_j k`` (Eq. 8)
depends only on the relative rotation of the two rays: invariant to a global rotation of the
world, blind to translation. Values and outputs are untouched.
"""

import jax.numpy as jnp

from jaxwm.encodings.base import CameraEncoding, ray_frames


def viewrope_rotate(x, rot, idx):
  """Rotates the channel triples ``idx`` of ``x [B, L, H, D]`` by ``rot [B, L, 3, 3]`` (Eq. 7)."""
  sub = x[..., idx].astype(jnp.float32)
  sub = sub.reshape(sub.shape[:-1] + (len(idx) // 3, 3))
  out = jnp.einsum("blij,blhmj->blhmi", rot.astype(jnp.float32), sub)
  return x.at[..., idx].set(out.reshape(out.shape[:-2] + (len(idx),)).astype(x.dtype))


class ViewRope(CameraEncoding):
  """ViewRope: per-token 3x3 rotations on channel triples of q and k."""
  name = "viewrope"
  unit = 3

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    """``rot [B, S*N, 3, 3] = R_c2w R_local`` (Eq. 6)."""
    r_local = ray_frames(intrinsics, grid_hw, patch_hw, cam_cfg.vae_stride)
    rot = c2w[:, :, None, :3, :3] @ r_local
    return rot.reshape((rot.shape[0], -1, 3, 3))

  def encode_q(self, q, cam, plan):
    return viewrope_rotate(q, cam, plan.idx)

  def encode_kv(self, k, v, cam, plan, params):
    return viewrope_rotate(k, cam, plan.idx), v


ENCODING = ViewRope()
