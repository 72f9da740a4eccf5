"""Analytic ray casting of a :class:`Scene` (numpy, vectorised over all pixels of all frames).

Each pixel casts one ray through its centre (continuous coordinates, centre of pixel
``(i, j)`` at ``(j + 0.5, i + 0.5)``). Surfaces are Lambertian with a fixed light, so colours
are view-independent and the projective warp of a frame reproduces the others.
"""

import numpy as np

from jaxwm.geometry.cameras import pixel_centers
from jaxwm.geometry.validate import validate_cameras

_EPS = 1e-4
LOD_BIAS = 1.0


def _bilinear(tex, u, v):
  """Bilinear lookup of ``tex [T, T, 3]`` at ``u, v`` in ``[0, 1]``: ``[n, 3]``."""
  t = tex.shape[0]
  x = np.clip(u, 0.0, 1.0) * (t - 1)
  y = np.clip(v, 0.0, 1.0) * (t - 1)
  x0 = np.minimum(x.astype(np.int32), t - 2)
  y0 = np.minimum(y.astype(np.int32), t - 2)
  fx, fy = (x - x0)[:, None], (y - y0)[:, None]
  flat = tex.reshape(-1, 3)
  i = y0 * t + x0
  top = flat[i] * (1 - fx) + flat[i + 1] * fx
  bot = flat[i + t] * (1 - fx) + flat[i + t + 1] * fx
  return top * (1 - fy) + bot * fy


def _lookup(levels, index, u, v, texel_per_world, footprint):
  """Trilinear (mip-mapped) lookup of texture ``index`` of a pyramid ``levels``.

  The level of detail is ``log2(footprint * texel_per_world) + LOD_BIAS``: the world size of a
  pixel at the hit, in texels of level 0, one level blurrier than the Nyquist choice so that
  frames are band-limited at the pixel scale.
  """
  lod = np.clip(np.log2(np.maximum(footprint * texel_per_world, 1e-6)) + LOD_BIAS, 0.0, len(levels) - 1.0)
  lo = np.floor(lod).astype(np.int32)
  frac = (lod - lo)[:, None]
  out = np.empty((u.shape[0], 3), np.float32)
  for level in np.unique(lo):
    m = np.flatnonzero(lo == level)
    a = _bilinear(levels[level][index], u[m], v[m])
    if level + 1 < len(levels):
      a = a * (1 - frac[m]) + _bilinear(levels[level + 1][index], u[m], v[m]) * frac[m]
    out[m] = a
  return out


def _footprint(dist, pixel_angle, cos, max_stretch=4.0):
  """World size of a pixel at distance ``dist`` on a surface seen at incidence cosine ``cos``."""
  return dist * pixel_angle / np.maximum(cos, 1.0 / max_stretch)


def _face_uv(p, axis, lo, hi):
  """Planar coordinates in ``[0, 1]`` of points ``p [n, 3]`` on a face normal to ``axis``."""
  a, b = [i for i in range(3) if i != axis]
  return (p[:, a] - lo[a]) / (hi[a] - lo[a]), (p[:, b] - lo[b]) / (hi[b] - lo[b])


def cast(scene, origins, dirs, pixel_angle):
  """Casts rays ``origins + t dirs`` (``[n, 3]`` each) from inside the room.

  ``pixel_angle [n]`` is the angular size of a pixel along each ray (about ``1 / f`` at the
  centre of a pinhole image); it sets the texture level of detail.

  Returns:
    ``(rgb [n, 3] float32 in [0, 1], t [n] float32, surface [n] int32)``: colour, ray
    parameter of the hit, and the id of the smooth surface hit (room faces 0-5, then one per
    sphere, then six per box).
  """
  n = dirs.shape[0]
  half = scene.half_extent
  with np.errstate(divide="ignore", invalid="ignore"):
    inv = 1.0 / dirs
    # Room interior: exit distance per axis.
    t_axes = np.where(dirs > 0, half - origins, -half - origins) * inv
    t_axes = np.where(np.isfinite(t_axes), t_axes, np.inf)
  room_axis = np.argmin(t_axes, axis=1)
  t_best = np.take_along_axis(t_axes, room_axis[:, None], 1)[:, 0].astype(np.float32)
  hit_id = np.zeros(n, np.int32)  # 0 room, 1..S spheres, S+1.. boxes
  hit_axis = room_axis.astype(np.int32)
  for s, (c, r) in enumerate(zip(scene.sphere_center, scene.sphere_radius)):
    oc = origins - c
    a = np.einsum("ij,ij->i", dirs, dirs)
    b = np.einsum("ij,ij->i", oc, dirs)
    disc = b * b - a * (np.einsum("ij,ij->i", oc, oc) - r * r)
    with np.errstate(invalid="ignore"):
      t = (-b - np.sqrt(disc)) / a
    closer = (disc > 0) & (t > _EPS) & (t < t_best)
    t_best = np.where(closer, t, t_best)
    hit_id = np.where(closer, 1 + s, hit_id)
  n_sph = len(scene.sphere_radius)
  for bi, (lo, hi) in enumerate(zip(scene.box_lo, scene.box_hi)):
    with np.errstate(invalid="ignore"):
      t1, t2 = (lo - origins) * inv, (hi - origins) * inv
    tmin = np.minimum(t1, t2)
    tmin = np.where(np.isnan(tmin), -np.inf, tmin)
    tmax = np.maximum(t1, t2)
    tmax = np.where(np.isnan(tmax), np.inf, tmax)
    axis = np.argmax(tmin, axis=1)
    t_near = np.take_along_axis(tmin, axis[:, None], 1)[:, 0]
    closer = (t_near <= tmax.min(axis=1)) & (t_near > _EPS) & (t_near < t_best)
    t_best = np.where(closer, t_near, t_best)
    hit_id = np.where(closer, 1 + n_sph + bi, hit_id)
    hit_axis = np.where(closer, axis, hit_axis)

  p = origins + dirs * t_best[:, None]
  dist = t_best * np.linalg.norm(dirs, axis=1)
  rgb = np.zeros((n, 3), np.float32)
  normal = np.zeros((n, 3), np.float32)
  surface = np.zeros(n, np.int32)
  # Room faces: texture index 2 * axis + (positive side), inward normal.
  room = hit_id == 0
  for axis in range(3):
    for side in (0, 1):
      m = np.flatnonzero(room & (hit_axis == axis) & ((dirs[:, axis] > 0) == bool(side)))
      if m.size:
        u, v = _face_uv(p[m], axis, -half, half)
        cos = np.abs(dirs[m, axis]) / np.linalg.norm(dirs[m], axis=1)
        tpw = scene.room_textures.shape[1] / (2.0 * half[[i for i in range(3) if i != axis]].min())
        rgb[m] = _lookup(scene.mips["room_textures"], 2 * axis + side, u, v, tpw, _footprint(dist[m], pixel_angle[m], cos))
        normal[m, axis] = -1.0 if side else 1.0
        surface[m] = 2 * axis + side
  for s in range(n_sph):
    m = np.flatnonzero(hit_id == 1 + s)
    if m.size:
      nrm = (p[m] - scene.sphere_center[s]) / scene.sphere_radius[s]
      u = np.abs(np.arctan2(nrm[:, 0], nrm[:, 2]) / np.pi)  # mirrored longitude: no seam
      v = np.arccos(np.clip(nrm[:, 1], -1.0, 1.0)) / np.pi
      cos = np.abs(np.einsum("ij,ij->i", nrm, dirs[m])) / np.linalg.norm(dirs[m], axis=1)
      tpw = scene.sphere_textures.shape[1] / (np.pi * scene.sphere_radius[s])
      rgb[m] = _lookup(scene.mips["sphere_textures"], s, u, v, tpw, _footprint(dist[m], pixel_angle[m], cos))
      normal[m] = nrm
      surface[m] = 6 + s
  for bi in range(len(scene.box_lo)):
    lo, hi = scene.box_lo[bi], scene.box_hi[bi]
    for axis in range(3):
      for side in (0, 1):
        m = np.flatnonzero((hit_id == 1 + n_sph + bi) & (hit_axis == axis) & ((dirs[:, axis] < 0) == bool(side)))
        if m.size:
          u, v = _face_uv(p[m], axis, lo, hi)
          face = 2 * axis + side
          cos = np.abs(dirs[m, axis]) / np.linalg.norm(dirs[m], axis=1)
          tpw = scene.box_textures.shape[1] / (3.0 * (hi - lo)[[i for i in range(3) if i != axis]].min())
          rgb[m] = _lookup(scene.mips["box_textures"], bi, (u + face % 3) / 3.0, (v + face // 3) / 2.0, tpw,
                           _footprint(dist[m], pixel_angle[m], cos))
          normal[m, axis] = 1.0 if side else -1.0
          surface[m] = 6 + n_sph + 6 * bi + face
  shade = 0.55 + 0.45 * np.maximum(normal @ scene.light_dir, 0.0)
  return rgb * shade[:, None], t_best, surface


def render(scene, c2w, intrinsics, image_hw, chunk_frames=8, return_surface=False):
  """Renders frames and z-depth.

  Args:
    scene: a :class:`Scene`.
    c2w: ``[F, 4, 4]`` OpenCV camera-to-world; intrinsics: ``[F, 3, 3]`` in pixels.
    image_hw: ``(H, W)``.
    chunk_frames: frames ray-cast together (bounds memory).
    return_surface: also return the surface id of each pixel (see :func:`cast`).

  Returns:
    ``(frames uint8 [F, H, W, 3], depth float32 [F, H, W])``, plus ``surface int32 [F, H, W]``
    if asked.
  """
  c2w = np.asarray(c2w, np.float32)
  k = np.asarray(intrinsics, np.float32)
  validate_cameras(c2w, k)
  h, w = image_hw
  uv = pixel_centers(h, w).reshape(-1, 2)
  frames = np.empty((len(c2w), h, w, 3), np.uint8)
  depth = np.empty((len(c2w), h, w), np.float32)
  surface = np.empty((len(c2w), h, w), np.int32)
  for start in range(0, len(c2w), chunk_frames):
    sl = slice(start, start + chunk_frames)
    kk, tt = k[sl], c2w[sl]
    # z = 1 camera rays, so the ray parameter of a hit is its z-depth.
    y = (uv[None, :, 1] - kk[:, 1, 2, None]) / kk[:, 1, 1, None]
    x = (uv[None, :, 0] - kk[:, 0, 2, None] - kk[:, 0, 1, None] * y) / kk[:, 0, 0, None]
    d_cam = np.stack([x, y, np.ones_like(x)], -1)  # [f, HW, 3]
    d_world = np.einsum("fij,fnj->fni", tt[:, :3, :3], d_cam).reshape(-1, 3)
    origins = np.repeat(tt[:, :3, 3], h * w, axis=0)
    # Angular pixel size along each ray: about 1 / (f |d|) for z = 1 rays.
    pixel_angle = 1.0 / (np.sqrt(kk[:, 0, 0, None] * kk[:, 1, 1, None]) * np.linalg.norm(d_cam, axis=-1))
    rgb, t, sid = cast(scene, origins, d_world, pixel_angle.reshape(-1))
    nf = len(kk)
    frames[sl] = np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8).reshape(nf, h, w, 3)
    depth[sl] = t.reshape(nf, h, w)
    surface[sl] = sid.reshape(nf, h, w)
  return (frames, depth, surface) if return_surface else (frames, depth)
