"""Camera quantities against closed forms and brute-force float64 computations."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import random_intrinsics, random_poses, random_rotations

from jaxwm import geometry as g


def test_principal_point_ray_is_optical_axis(rng):
  k = random_intrinsics(rng, 8)
  uv = np.stack([k[:, 0, 2], k[:, 1, 2]], -1)[:, None, :]  # one point per camera
  for i in range(8):
    np.testing.assert_allclose(g.pixel_rays(k[i], uv[i]), [[0.0, 0.0, 1.0]], atol=1e-12)


def test_pixel_rays_reproject(rng):
  k = random_intrinsics(rng, 4)
  uv = g.pixel_centers(6, 7).astype(np.float64)
  rays = g.pixel_rays(k, uv)
  np.testing.assert_allclose(np.linalg.norm(rays, axis=-1), 1.0, atol=1e-12)
  proj = np.einsum("nij,nhwj->nhwi", k, rays)
  np.testing.assert_allclose(proj[..., :2] / proj[..., 2:], np.broadcast_to(uv, proj.shape[:-1] + (2,)), atol=1e-9)


def test_token_pixel_centers():
  c = g.token_pixel_centers((3, 4), patch_size=(2, 2), vae_stride=(8, 8))
  assert c.shape == (3, 4, 2)
  # Token (a, b) covers pixels [16 b, 16 b + 16) x [16 a, 16 a + 16): centre at 16 b + 8.
  np.testing.assert_array_equal(c[1, 2], [40.0, 24.0])
  # With patch 1 and stride 1, token centres are pixel centres.
  np.testing.assert_array_equal(g.token_pixel_centers((5, 6), (1, 1), (1, 1)), g.pixel_centers(5, 6))


def test_viewrope_rotations(rng):
  c2w = random_poses(rng, 3)
  k = random_intrinsics(rng, 3, hw=(64, 96))
  rot = g.viewrope_rotations(c2w, k, (4, 6), patch_size=(2, 2), vae_stride=(8, 8))
  assert rot.shape == (3, 4, 6, 3, 3)
  # R z is the token's world viewing direction, and R is orthonormal.
  d, _ = g.world_rays(c2w, k, g.token_pixel_centers((4, 6)))
  np.testing.assert_allclose(rot[..., :, 2], d, atol=1e-12)
  np.testing.assert_allclose(np.swapaxes(rot, -1, -2) @ rot, np.broadcast_to(np.eye(3), rot.shape), atol=1e-12)
  # jax under jit agrees in float32.
  got = jax.jit(lambda a, b: g.viewrope_rotations(a, b, (4, 6)))(jnp.asarray(c2w, jnp.float32),
                                                                   jnp.asarray(k, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), rot, atol=1e-5)


def test_viewrope_relative_rotation_invariant_to_world_rotation(rng):
  c2w = random_poses(rng, 2)
  k = random_intrinsics(rng, 2)
  q = random_rotations(rng, 1)[0]
  world = np.eye(4)
  world[:3, :3] = q
  r = g.viewrope_rotations(c2w, k, (2, 3), (1, 1), (1, 1))
  r2 = g.viewrope_rotations(world @ c2w, k, (2, 3), (1, 1), (1, 1))
  rel = np.swapaxes(r[0], -1, -2) @ r[1]
  rel2 = np.swapaxes(r2[0], -1, -2) @ r2[1]
  np.testing.assert_allclose(rel, rel2, atol=1e-12)


def test_plucker_moments(rng):
  c2w = random_poses(rng, 2)
  k = random_intrinsics(rng, 2)
  uv = g.pixel_centers(3, 5)
  pl = g.plucker(c2w, k, uv)
  assert pl.shape == (2, 3, 5, 6)
  d, m = pl[..., :3], pl[..., 3:]
  o = c2w[:, None, None, :3, 3]
  np.testing.assert_allclose(m, np.cross(np.broadcast_to(o, d.shape), d), atol=1e-12)
  # The moment is the same for every point of the line, and orthogonal to the direction.
  p = o + 2.7 * d
  np.testing.assert_allclose(np.cross(p, d), m, atol=1e-9)
  np.testing.assert_allclose(np.sum(d * m, -1), 0.0, atol=1e-9)


def test_prope_projection(rng):
  c2w = random_poses(rng, 5)
  hw = (48, 64)
  k = random_intrinsics(rng, 5, hw)
  p, p_inv = g.prope_projection(c2w, k, hw)
  np.testing.assert_allclose(p @ p_inv, np.broadcast_to(np.eye(4), p.shape), atol=1e-9)
  # Written out: P = [[Kn R_w2c, Kn t_w2c], [0, 1]] with Kn from the normalised intrinsics.
  for i in range(5):
    h, w = hw
    kn = np.array([[k[i, 0, 0] / w, 0, k[i, 0, 2] / w - 0.5], [0, k[i, 1, 1] / h, k[i, 1, 2] / h - 0.5], [0, 0, 1]])
    w2c = np.linalg.inv(c2w[i])
    ref = np.eye(4)
    ref[:3, :3], ref[:3, 3] = kn @ w2c[:3, :3], kn @ w2c[:3, 3]
    np.testing.assert_allclose(p[i], ref, atol=1e-12)
  # A world point projects to its normalised pixel: (u / W - 0.5, v / H - 0.5).
  x = np.append(c2w[0, :3, 3] + c2w[0, :3, :3] @ np.array([0.3, -0.2, 2.0]), 1.0)
  y = p[0] @ x
  pix = k[0] @ (np.linalg.inv(c2w[0]) @ x)[:3]
  np.testing.assert_allclose(y[:2] / y[2], [pix[0] / pix[2] / 64 - 0.5, pix[1] / pix[2] / 48 - 0.5], atol=1e-12)


def test_reanchor(rng):
  c2w = random_poses(rng, 6)[None].repeat(2, 0)
  out = g.reanchor(c2w)
  np.testing.assert_allclose(out[:, 0], np.broadcast_to(np.eye(4), (2, 4, 4)), atol=1e-12)
  # Relative poses are preserved.
  rel = np.linalg.inv(c2w[0, 2]) @ c2w[0, 5]
  np.testing.assert_allclose(np.linalg.inv(out[0, 2]) @ out[0, 5], rel, atol=1e-9)
  # Re-anchoring removes any common change of world frame.
  world = random_poses(rng, 1)[0]
  np.testing.assert_allclose(g.reanchor(world @ c2w), out, atol=1e-9)


def test_fibonacci_sphere():
  d = g.fibonacci_sphere(4096)
  assert d.shape == (4096, 3)
  np.testing.assert_allclose(np.linalg.norm(d, axis=-1), 1.0, atol=1e-12)
  np.testing.assert_allclose(d.mean(0), 0.0, atol=2e-3)
  # Near-uniform: each octant holds 1/8 of the points.
  octant = (d[:, 0] > 0) * 4 + (d[:, 1] > 0) * 2 + (d[:, 2] > 0)
  counts = np.bincount(octant, minlength=8)
  assert np.all(np.abs(counts - 512) < 20), counts


def test_fov_mask_brute_force(rng):
  hw = (48, 64)
  c2w = random_poses(rng, 4)
  k = random_intrinsics(rng, 4, hw)
  d = g.fibonacci_sphere(2000)
  mask = g.fov_mask(d, c2w, k, hw)
  for i in range(4):
    for n in range(0, 2000, 7):
      cam = np.linalg.inv(c2w[i][:3, :3]) @ d[n]
      inside = False
      if cam[2] > 0:
        u, v, w = k[i] @ cam
        inside = 0 <= u / w <= hw[1] and 0 <= v / w <= hw[0]
      assert mask[i, n] == inside
  # The optical axis is always inside; its opposite never.
  axis = c2w[:, :3, 2]
  for i in range(4):
    assert g.fov_mask(axis[i:i + 1], c2w[i], k[i], hw)[0]
    assert not g.fov_mask(-axis[i:i + 1], c2w[i], k[i], hw)[0]


def test_warp_rotation_only_is_homography(rng):
  hw = (12, 16)
  k = random_intrinsics(rng, 2, hw)
  c2w = random_poses(rng, 2)
  c2w[1, :3, 3] = c2w[0, :3, 3]  # same centre: rotation only
  c2w[1, :3, :3] = c2w[0, :3, :3] @ g.axis_angle_to_matrix(np.array([0.05, -0.1, 0.08]))
  depth = rng.uniform(0.5, 20.0, hw)  # any depth
  uv, _ = g.warp_coordinates(depth, k[0], c2w[0], k[1], c2w[1])
  r = c2w[1, :3, :3].T @ c2w[0, :3, :3]  # camera t -> camera k
  hmat = k[1] @ r @ np.linalg.inv(k[0])
  src = g.pixel_centers(*hw).astype(np.float64)
  homog = np.concatenate([src, np.ones(hw + (1,))], -1) @ hmat.T
  np.testing.assert_allclose(uv, homog[..., :2] / homog[..., 2:], atol=1e-8)


def test_warp_with_translation_matches_explicit_points(rng):
  hw = (10, 14)
  k = random_intrinsics(rng, 2, hw)
  c2w = random_poses(rng, 2, scale=0.3)
  depth = rng.uniform(1.0, 5.0, hw)
  uv, z = g.warp_coordinates(depth, k[0], c2w[0], k[1], c2w[1])
  for i in range(hw[0]):
    for j in range(hw[1]):
      x_cam = np.linalg.inv(k[0]) @ np.array([j + 0.5, i + 0.5, 1.0]) * depth[i, j]
      x_world = c2w[0] @ np.append(x_cam, 1)
      x_k = np.linalg.inv(c2w[1]) @ x_world
      p = k[1] @ x_k[:3]
      np.testing.assert_allclose(uv[i, j], p[:2] / p[2], atol=1e-9)
      np.testing.assert_allclose(z[i, j], x_k[2], atol=1e-12)


def test_bilinear_sample_matches_linear_function():
  yy, xx = np.meshgrid(np.arange(6) + 0.5, np.arange(7) + 0.5, indexing="ij")
  img = np.stack([2 * xx + 3 * yy, xx - yy], -1)
  uv = np.array([[1.3, 2.2], [4.9, 0.7], [3.5, 3.5]])
  out = g.bilinear_sample(img, uv)
  np.testing.assert_allclose(out, np.stack([2 * uv[:, 0] + 3 * uv[:, 1], uv[:, 0] - uv[:, 1]], -1), atol=1e-12)
