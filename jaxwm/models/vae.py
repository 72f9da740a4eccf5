"""Space-to-depth latents: the lossless stand-in for a video VAE on the procedural scenes.

jaxwm's backbone consumes ``[B, F, h, w, C]`` latents. Wan 2.2's VAE (16x spatial stride,
48 channels) is not part of this repository; on the procedural data the "latent" of a frame
is its pixels in ``[-1, 1]`` folded into channels: ``[H, W, 3] -> [H/s, W/s, 3 s^2]``
(with ``s = 4``: 64x64x3 -> 16x16x48, Wan 2.2's channel count). No temporal compression.
"""

import jax.numpy as jnp


def encode(frames, stride=4):
  """``[..., F, H, W, 3]`` uint8 or float in ``[-1, 1]`` -> ``[..., F, H/s, W/s, 3 s^2]`` float32."""
  if frames.dtype == jnp.uint8:
    frames = frames.astype(jnp.float32) / 127.5 - 1.0
  *lead, h, w, c = frames.shape
  if h % stride or w % stride:
    raise ValueError(f"frame size {(h, w)} is not divisible by the latent stride {stride}")
  x = frames.reshape(*lead, h // stride, stride, w // stride, stride, c)
  n = len(lead)
  x = x.transpose(*range(n), n, n + 2, n + 1, n + 3, n + 4)
  return x.reshape(*lead, h // stride, w // stride, stride * stride * c).astype(jnp.float32)


def decode(latents, stride=4):
  """Inverse of :func:`encode`: ``[..., h, w, 3 s^2]`` -> ``[..., h s, w s, 3]`` float in ``[-1, 1]``."""
  *lead, h, w, cc = latents.shape
  c = cc // (stride * stride)
  x = latents.reshape(*lead, h, w, stride, stride, c)
  n = len(lead)
  x = x.transpose(*range(n), n, n + 2, n + 1, n + 3, n + 4)
  return x.reshape(*lead, h * stride, w * stride, c)


def to_uint8(frames):
  """``[-1, 1]`` floats -> uint8."""
  return jnp.clip(jnp.round((frames + 1.0) * 127.5), 0, 255).astype(jnp.uint8)
