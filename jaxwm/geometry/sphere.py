"""Fibonacci sphere directions and field-of-view masks (LOCI App. A panorama coverage)."""

import numpy as np

from jaxwm.geometry._xp import asarray, xp_of


def fibonacci_sphere(n):
  """``[n, 3]`` near-uniform unit directions: ``z_i = 1 - (2i + 1) / n``, golden-angle longitude."""
  i = np.arange(n, dtype=np.float64)
  z = 1.0 - (2.0 * i + 1.0) / n
  r = np.sqrt(np.maximum(0.0, 1.0 - z * z))
  phi = i * np.pi * (3.0 - np.sqrt(5.0))
  return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)


def fov_mask(directions, c2w, intrinsics, image_hw):
  """Whether world directions fall inside each camera's rectangular pinhole image.

  A direction ``d`` is inside when ``R_c2w^T d`` has ``z > 0`` and projects into
  ``[0, W] x [0, H]``. Camera position is irrelevant (directions at infinity).

  Args:
    directions: ``[n, 3]`` unit world directions.
    c2w: ``[..., 4, 4]``; intrinsics: ``[..., 3, 3]``; image_hw: ``(H, W)``.

  Returns:
    ``[..., n]`` bool.
  """
  xp = xp_of(directions, c2w, intrinsics)
  d = asarray(xp, directions)
  c2w, k = asarray(xp, c2w), asarray(xp, intrinsics)
  cam = xp.einsum("...ji,nj->...ni", c2w[..., :3, :3], d)  # R^T d
  z = cam[..., 2]
  safe = xp.where(z > 1e-9, z, 1.0)
  pix = xp.einsum("...ij,...nj->...ni", k, cam / safe[..., None])
  h, w = image_hw
  return (z > 1e-9) & (pix[..., 0] >= 0) & (pix[..., 0] <= w) & (pix[..., 1] >= 0) & (pix[..., 1] <= h)
