"""Plücker action injection (ReWorld §2.2; docs/design.md §4): per latent pixel the Plücker
coordinates ``(d, o x d)`` of its ray under the model's poses, patchified like the latents; the
model maps them to its width and adds them to the patch embeddings (zero-initialised)."""

import jax.numpy as jnp

from jaxwm.geometry.cameras import plucker, token_pixel_centers


def plucker_tokens(c2w, intrinsics, latent_hw, patch_hw, vae_stride):
  """``c2w [B, S, 4, 4]`` (model poses), ``intrinsics [B, S, 3, 3]`` -> ``[B, S*h'*w', 6 * ph * pw]``."""
  h, w = latent_hw
  uv = token_pixel_centers((h, w), (1, 1), (vae_stride, vae_stride), xp=jnp)
  pl = plucker(c2w.astype(jnp.float32), intrinsics.astype(jnp.float32), uv)  # [B, S, h, w, 6]
  b, s = pl.shape[:2]
  ph, pw = patch_hw
  pl = pl.reshape(b, s, h // ph, ph, w // pw, pw, 6).transpose(0, 1, 2, 4, 3, 5, 6)
  return pl.reshape(b, s * (h // ph) * (w // pw), ph * pw * 6)
