"""Projective warp between frames with depth (ViewRope App. B, Eqs. 14-16).

With ``w2c = [R | P]``, a pixel ``u`` of frame ``t`` with depth ``D_t(u)`` lifts to
``X_t = K_t^-1 u~ D_t(u)`` (Eq. 14), moves to frame ``k`` as
``X_k = R_k R_t^-1 X_t + (P_k - R_k R_t^-1 P_t)`` (Eq. 15) and lands at
``W_{k<-t}(u) = pi(K_k X_k)`` (Eq. 16). Depth is z-depth (distance along the optical axis).
"""

from jaxwm.geometry._xp import asarray, xp_of
from jaxwm.geometry.cameras import pixel_centers, pixel_rays
from jaxwm.geometry.rotations import se3_inverse


def warp_coordinates(depth_t, intrinsics_t, c2w_t, intrinsics_k, c2w_k):
  """Where each pixel of frame ``t`` lands in frame ``k`` (Eqs. 14-16).

  Args:
    depth_t: ``[H, W]`` z-depth of frame ``t``.
    intrinsics_t, intrinsics_k: ``[3, 3]``; c2w_t, c2w_k: ``[4, 4]``.

  Returns:
    ``(uv_k, z_k)``: ``[H, W, 2]`` pixel coordinates in frame ``k`` and ``[H, W]`` depth there
    (non-positive when the point is behind camera ``k``).
  """
  xp = xp_of(depth_t, intrinsics_t, c2w_t, intrinsics_k, c2w_k)
  depth_t = asarray(xp, depth_t)
  h, w = depth_t.shape
  x_t = pixel_rays(intrinsics_t, pixel_centers(h, w, xp=xp), normalize=False) * depth_t[..., None]  # Eq. 14
  rel = se3_inverse(c2w_k) @ asarray(xp, c2w_t)  # [R_k R_t^-1 | P_k - R_k R_t^-1 P_t]
  x_k = x_t @ xp.swapaxes(rel[:3, :3], 0, 1) + rel[:3, 3]  # Eq. 15
  z = x_k[..., 2]
  safe = xp.where(xp.abs(z) > 1e-9, z, 1e-9)
  proj = (x_k / safe[..., None]) @ xp.swapaxes(asarray(xp, intrinsics_k), 0, 1)  # Eq. 16
  return proj[..., :2], z


def bilinear_sample(image, uv):
  """Samples ``image [H, W, C]`` at continuous pixel coordinates ``uv [..., 2]`` (edge-clamped)."""
  xp = xp_of(image, uv)
  image, uv = asarray(xp, image), asarray(xp, uv)
  h, w = image.shape[:2]
  x = uv[..., 0] - 0.5
  y = uv[..., 1] - 0.5
  x0, y0 = xp.floor(x), xp.floor(y)
  fx, fy = (x - x0)[..., None], (y - y0)[..., None]
  x0i = xp.clip(x0, 0, w - 1).astype(xp.int32)
  x1i = xp.clip(x0 + 1, 0, w - 1).astype(xp.int32)
  y0i = xp.clip(y0, 0, h - 1).astype(xp.int32)
  y1i = xp.clip(y0 + 1, 0, h - 1).astype(xp.int32)
  top = image[y0i, x0i] * (1 - fx) + image[y0i, x1i] * fx
  bot = image[y1i, x0i] * (1 - fx) + image[y1i, x1i] * fx
  return top * (1 - fy) + bot * fy


def _footprint(image, uv):
  """The four pixels of ``image [H, W]`` around each point ``uv [..., 2]`` (the bilinear footprint, edge-clamped):
  ``[4, ...]``."""
  xp = xp_of(image, uv)
  h, w = image.shape[:2]
  x0, y0 = xp.floor(uv[..., 0] - 0.5), xp.floor(uv[..., 1] - 0.5)
  xs = [xp.clip(x0 + d, 0, w - 1).astype(xp.int32) for d in (0, 1)]
  ys = [xp.clip(y0 + d, 0, h - 1).astype(xp.int32) for d in (0, 1)]
  return xp.stack([image[y, x] for y in ys for x in xs])


def warp_frame(src_image, src_depth, src_intrinsics, src_c2w, dst_depth, dst_intrinsics, dst_c2w, depth_rtol=0.02,
               max_spread=0.15):
  """Warps a source frame into a destination view using the destination's depth.

  Each destination pixel is lifted with ``dst_depth``, projected into the source view
  (Eqs. 14-16 with ``t = dst``, ``k = src``) and the source image is sampled there.

  Occlusion test: the projected depth ``z`` must lie within the depths ``d_1..d_4`` of the four source pixels
  around the landing point, ``min d (1 - rtol) <= z <= max d (1 + rtol)`` (on a smooth surface the
  depth at a point lies between its neighbours', however slanted the surface), and the footprint must not
  straddle a depth edge: ``max d - min d <= max_spread * z`` (an occluder's silhouette).

  Args:
    src_image: ``[H, W, C]``; src_depth, dst_depth: ``[H, W]`` z-depth.
    depth_rtol: relative depth tolerance of the occlusion test.
    max_spread: largest relative depth spread of a footprint that counts as one surface.

  Returns:
    ``(warped [H, W, C], valid [H, W] bool)``: ``valid`` marks pixels that are in front of
    the source camera, inside its image, and not occluded there.
  """
  xp = xp_of(src_image, src_depth, dst_depth)
  uv, z = warp_coordinates(dst_depth, dst_intrinsics, dst_c2w, src_intrinsics, src_c2w)
  src_depth = asarray(xp, src_depth)
  h, w = src_depth.shape
  inside = (z > 1e-6) & (uv[..., 0] >= 0.5) & (uv[..., 0] <= w - 0.5) & (uv[..., 1] >= 0.5) & (uv[..., 1] <= h - 0.5)
  d = _footprint(src_depth, uv)
  lo, hi = d.min(0), d.max(0)
  az = xp.abs(z)
  agree = inside & (z >= lo * (1 - depth_rtol)) & (z <= hi * (1 + depth_rtol)) & (hi - lo <= max_spread * az)
  return bilinear_sample(src_image, uv), agree
