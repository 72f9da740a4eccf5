"""Per-token camera quantities: pixel centres of a token grid, rays (ViewRope Eq. 5),
ViewRope rotations (Eq. 6), Plücker maps (ReWorld §2.2), PRoPE projection matrices, and
re-anchoring on the first frame.

Conventions (docs/design.md §1, §3): OpenCV camera basis (x right, y down, z forward); ``c2w`` is
``[..., 4, 4]`` camera-to-world; ``intrinsics`` ``[..., 3, 3]`` in pixels of the frame the
camera was recorded at. Continuous pixel coordinates put the centre of pixel ``(i, j)``
(row, column) at ``(u, v) = (j + 0.5, i + 0.5)``, so a centred principal point is
``(W / 2, H / 2)``, the convention of RealEstate10K's normalised intrinsics.
"""

from jaxwm.geometry._xp import asarray, xp_of
from jaxwm.geometry.rotations import rotation_z_to, se3_inverse


def pixel_centers(height, width, xp=None):
  """``[height, width, 2]`` continuous ``(u, v)`` of the pixel centres (see module doc)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  xp = xp or np
  v, u = xp.meshgrid(xp.arange(height, dtype=xp.float32) + 0.5, xp.arange(width, dtype=xp.float32) + 0.5,
                     indexing="ij")
  return xp.stack([u, v], -1)


def token_pixel_centers(grid_hw, patch_size=(2, 2), vae_stride=(8, 8), xp=None):
  """Pixel centres of the tokens of a latent grid.

  A token ``(a, b)`` of a ``grid_hw = (h', w')`` token grid covers
  ``patch * stride`` pixels per axis; its centre is ``((b + 0.5) sw pw, (a + 0.5) sh ph)``.

  Returns:
    ``[h', w', 2]`` ``(u, v)`` in pixels of the frame (``H = h' ph sh``, ``W = w' pw sw``).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  xp = xp or np
  (gh, gw), (ph, pw), (sh, sw) = grid_hw, patch_size, vae_stride
  v, u = xp.meshgrid((xp.arange(gh, dtype=xp.float32) + 0.5) * (ph * sh),
                     (xp.arange(gw, dtype=xp.float32) + 0.5) * (pw * sw), indexing="ij")
  return xp.stack([u, v], -1)


def _bcast_k(k, n_extra):
  """Adds ``n_extra`` singleton dims before the matrix dims of ``k``."""
  return k.reshape(k.shape[:-2] + (1,) * n_extra + k.shape[-2:])


def pixel_rays(intrinsics, uv, normalize=True):
  """Camera-space rays ``K^-1 [u, v, 1]`` (ViewRope Eq. 5).

  Args:
    intrinsics: ``[..., 3, 3]``.
    uv: ``[*grid, 2]`` pixel coordinates shared by all cameras.
    normalize: unit rays (Eq. 5) if True, else rays with ``z = 1`` (depth parametrisation).

  Returns:
    ``[..., *grid, 3]``.
  """
  xp = xp_of(intrinsics, uv)
  k, uv = asarray(xp, intrinsics), asarray(xp, uv)
  n = uv.ndim - 1
  kk = _bcast_k(k, n)
  fx, fy, cx, cy, skew = kk[..., 0, 0], kk[..., 1, 1], kk[..., 0, 2], kk[..., 1, 2], kk[..., 0, 1]
  y = (uv[..., 1] - cy) / fy
  x = (uv[..., 0] - cx - skew * y) / fx
  d = xp.stack([x, y, xp.ones_like(x)], -1)
  if normalize:
    d = d / xp.linalg.norm(d, axis=-1, keepdims=True)
  return d


def token_rays(intrinsics, grid_hw, patch_size=(2, 2), vae_stride=(8, 8)):
  """Unit camera-space rays at token centres: ``[..., 3, 3] -> [..., h', w', 3]`` (Eq. 5)."""
  xp = xp_of(intrinsics)
  return pixel_rays(intrinsics, token_pixel_centers(grid_hw, patch_size, vae_stride, xp=xp))


def world_rays(c2w, intrinsics, uv):
  """World-space unit ray directions ``R_c2w r`` and origins: ``([..., *grid, 3], [..., 3])``."""
  xp = xp_of(c2w, intrinsics, uv)
  c2w = asarray(xp, c2w)
  r = pixel_rays(intrinsics, uv)
  n = r.ndim - c2w.ndim + 1
  rot = _bcast_k(c2w[..., :3, :3], n)
  return (rot @ r[..., None])[..., 0], c2w[..., :3, 3]


def viewrope_rotations(c2w, intrinsics, grid_hw, patch_size=(2, 2), vae_stride=(8, 8)):
  """ViewRope per-token rotations ``R = R_c2w R_local(r)`` (Eq. 6).

  ``R_local`` is the minimal rotation taking the optical axis ``z`` to the token's ray ``r``,
  so ``R z`` is the token's world viewing direction.

  Args:
    c2w: ``[..., 4, 4]``; intrinsics: ``[..., 3, 3]``.

  Returns:
    ``[..., h', w', 3, 3]``.
  """
  xp = xp_of(c2w, intrinsics)
  c2w = asarray(xp, c2w)
  r_local = rotation_z_to(token_rays(intrinsics, grid_hw, patch_size, vae_stride))
  return _bcast_k(c2w[..., :3, :3], 2) @ r_local


def plucker(c2w, intrinsics, uv):
  """Plücker coordinates ``[d, o x d]`` of the rays through ``uv`` (ReWorld §2.2).

  ``d`` is the unit world direction and ``o`` the camera centre; pass re-anchored cameras to
  express them in the first frame's coordinates.

  Returns:
    ``[..., *grid, 6]``.
  """
  xp = xp_of(c2w, intrinsics, uv)
  d, o = world_rays(c2w, intrinsics, uv)
  o = o.reshape(o.shape[:-1] + (1,) * (d.ndim - o.ndim) + (3,))
  o = xp.broadcast_to(o, d.shape)
  return xp.concatenate([d, xp.cross(o, d)], -1)


def normalized_intrinsics(intrinsics, image_hw):
  """PRoPE's normalised intrinsics ``fx/W, fy/H, cx/W - 0.5, cy/H - 0.5``: ``[..., 3, 3]``."""
  xp = xp_of(intrinsics)
  k = asarray(xp, intrinsics)
  h, w = image_hw
  scale = xp.asarray([[1.0 / w, 1.0 / w, 1.0 / w], [1.0 / h, 1.0 / h, 1.0 / h], [0.0, 0.0, 1.0]], dtype=k.dtype)
  shift = xp.asarray([[0.0, 0.0, -0.5], [0.0, 0.0, -0.5], [0.0, 0.0, 0.0]], dtype=k.dtype)
  return k * scale + shift


def lift_intrinsics(k):
  """``[..., 3, 3] -> [..., 4, 4]`` with ``K`` top-left and 1 at ``[3, 3]``."""
  xp = xp_of(k)
  k = asarray(xp, k)
  top = xp.concatenate([k, xp.zeros(k.shape[:-1] + (1,), k.dtype)], -1)
  bottom = xp.broadcast_to(xp.asarray([0.0, 0.0, 0.0, 1.0], dtype=k.dtype), k.shape[:-2] + (1, 4))
  return xp.concatenate([top, bottom], -2)


def prope_projection(c2w, intrinsics, image_hw):
  """PRoPE projection matrices ``P = lift(K_n) w2c`` and ``P^-1 = c2w lift(K_n^-1)``.

  ``K_n`` are the normalised intrinsics (:func:`normalized_intrinsics`).

  Returns:
    ``(P, P_inv)``, each ``[..., 4, 4]``.
  """
  xp = xp_of(c2w, intrinsics)
  c2w = asarray(xp, c2w)
  kn = normalized_intrinsics(intrinsics, image_hw)
  return lift_intrinsics(kn) @ se3_inverse(c2w), c2w @ lift_intrinsics(xp.linalg.inv(kn))


def reanchor(c2w, anchor_index=0):
  """Expresses a trajectory in the coordinates of one of its frames: ``c2w'_f = c2w_a^-1 c2w_f``.

  Args:
    c2w: ``[..., F, 4, 4]``.

  Returns:
    ``[..., F, 4, 4]`` with frame ``anchor_index`` the identity.
  """
  xp = xp_of(c2w)
  c2w = asarray(xp, c2w)
  return se3_inverse(c2w[..., anchor_index:anchor_index + 1, :, :]) @ c2w
