"""PRoPE (Li et al. 2025; docs/design.md §3-4): GTA with the projective ``g = P = lift(K_n) w2c``.

``K_n`` are the intrinsics normalised by the image size (``fx/W, fy/H, cx/W - 0.5, cy/H - 0.5``)
and ``lift`` embeds a 3x3 matrix in a 4x4 one. With ``K_n = I`` it is exactly GTA.
"""

import jax.numpy as jnp

from jaxwm.encodings.gta import GTA
from jaxwm.geometry.cameras import lift_intrinsics, normalized_intrinsics
from jaxwm.geometry.rotations import se3_inverse


class PRoPE(GTA):
  """PRoPE: projective 4x4 tiles (per frame, or per token with ``per_token``)."""
  name = "prope"

  def matrices(self, cam_cfg, c2w, intrinsics, latent_hw):
    image_hw = (latent_hw[0] * cam_cfg.vae_stride, latent_hw[1] * cam_cfg.vae_stride)
    kn = normalized_intrinsics(intrinsics, image_hw)
    return lift_intrinsics(kn) @ se3_inverse(c2w), c2w @ lift_intrinsics(jnp.linalg.inv(kn))


ENCODING = PRoPE()
