"""Wan's 3D RoPE (docs/design.md §4): head dim split ``[t | h | w]``, pairs interleaved.

For head dim ``D``: ``h = w = 2 * (D // 6)`` channels, ``t = D - 2h``; per-axis frequencies
``1 / theta^(2i / dim_axis)``; a pair ``(x0, x1)`` at angle ``a`` becomes
``(x0 cos a - x1 sin a, x0 sin a + x1 cos a)``.
"""

import jax.numpy as jnp
import numpy as np


def rope_axis_dims(head_dim):
  """``(t, h, w)`` channel counts of the ``[t | h | w]`` split."""
  hw = 2 * (head_dim // 6)
  return head_dim - 2 * hw, hw, hw


def rope_frequencies(dim, theta=10000.0):
  """``[dim // 2]`` float64 frequencies ``1 / theta^(2i / dim)``."""
  return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope3d_angles(positions, head_dim, theta=10000.0):
  """Rotation angles of every channel pair.

  Args:
    positions: ``[..., 3]`` float ``(t, h, w)`` positions of each token.
    head_dim: ``D``.

  Returns:
    ``[..., D // 2]`` float32 angles, the pairs of the ``t`` block first, then ``h``, then ``w``.
  """
  dims = rope_axis_dims(head_dim)
  parts = [positions[..., i:i + 1].astype(jnp.float32) * jnp.asarray(rope_frequencies(d, theta), jnp.float32)
           for i, d in enumerate(dims)]
  return jnp.concatenate(parts, -1)


def apply_rotary(x, angles):
  """Rotates interleaved channel pairs of ``x [B, L, H, D]`` by ``angles [B or 1, L, (H,) D // 2]``."""
  if angles.ndim == 3:
    angles = angles[:, :, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  xf = x.astype(jnp.float32).reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))
  x0, x1 = xf[..., 0], xf[..., 1]
  out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
  return out.reshape(x.shape).astype(x.dtype)

