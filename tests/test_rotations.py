"""Rotations against closed forms and float64 references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_poses, random_rotations

from jaxwm import geometry as g


def _rodrigues_ref(axis, angle):
  """Textbook Rodrigues with an explicit unit axis (float64)."""
  k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
  return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


@pytest.mark.parametrize("angle", [0.0, 1e-9, 1e-4, 0.3, 1.7, 3.0, np.pi - 1e-7, np.pi])
def test_axis_angle_round_trip(rng, angle):
  for _ in range(5):
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    rot = g.axis_angle_to_matrix(axis * angle)
    np.testing.assert_allclose(rot, _rodrigues_ref(axis, angle), atol=1e-12)
    aa = g.matrix_to_axis_angle(rot)
    np.testing.assert_allclose(g.axis_angle_to_matrix(aa), rot, atol=1e-9)
    assert abs(np.linalg.norm(aa) - angle) < 1e-7
    assert abs(g.geodesic_angle(rot) - angle) < 1e-7


def test_axis_angle_jax_matches_float64(rng):
  aa = rng.normal(size=(64, 3))
  got = g.axis_angle_to_matrix(jnp.asarray(aa, jnp.float32))
  assert isinstance(got, jax.Array) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), g.axis_angle_to_matrix(aa), atol=2e-6)
  back = jax.jit(g.matrix_to_axis_angle)(got)
  np.testing.assert_allclose(g.axis_angle_to_matrix(np.asarray(back, np.float64)), g.axis_angle_to_matrix(aa),
                             atol=2e-5)


def test_axis_angle_gradient_finite_at_zero():
  grad = jax.grad(lambda v: jnp.sum(g.axis_angle_to_matrix(v) ** 2 * jnp.arange(9.0).reshape(3, 3)))(jnp.zeros(3))
  assert np.isfinite(np.asarray(grad)).all()


def test_rotation_z_to_maps_z_to_r(rng):
  r = rng.normal(size=(200, 3))
  r[:, 2] = np.abs(r[:, 2]) + 1e-3  # in front of the camera
  r /= np.linalg.norm(r, axis=-1, keepdims=True)
  rot = g.rotation_z_to(r)
  np.testing.assert_allclose(rot @ np.array([0, 0, 1.0]), r, atol=1e-12)  # R_local z = r
  np.testing.assert_allclose(np.swapaxes(rot, 1, 2) @ rot, np.broadcast_to(np.eye(3), rot.shape), atol=1e-12)
  np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-12)
  # Minimal: the angle is acos(z . r) and the axis is z x r.
  np.testing.assert_allclose(g.geodesic_angle(rot), np.arccos(r[:, 2]), atol=1e-7)
  axis = g.matrix_to_axis_angle(rot)
  zxr = np.cross(np.array([0, 0, 1.0]), r)
  np.testing.assert_allclose(np.cross(axis, zxr), 0.0, atol=1e-9)
  # r = z gives exactly the identity, without dividing by zero.
  np.testing.assert_array_equal(g.rotation_z_to(np.array([0.0, 0.0, 1.0])), np.eye(3))


def test_geodesic_angle_relative(rng):
  r1, r2 = random_rotations(rng, 50), random_rotations(rng, 50)
  rel = np.swapaxes(r1, 1, 2) @ r2
  ref = np.arccos(np.clip((np.trace(rel, axis1=1, axis2=2) - 1) / 2, -1, 1))
  np.testing.assert_allclose(g.geodesic_angle(r1, r2), ref, atol=1e-6)


def test_se3_inverse_and_compose(rng):
  a, b = random_poses(rng, 20), random_poses(rng, 20)
  np.testing.assert_allclose(g.se3_inverse(a), np.linalg.inv(a), atol=1e-12)
  np.testing.assert_allclose(g.se3_compose(a, g.se3_inverse(a)), np.broadcast_to(np.eye(4), a.shape), atol=1e-12)
  np.testing.assert_allclose(g.se3_compose(a, b), np.einsum("nij,njk->nik", a, b), atol=1e-12)


def test_interpolate_poses(rng):
  t0, t1 = random_poses(rng, 10), random_poses(rng, 10)
  np.testing.assert_allclose(g.interpolate_poses(t0, t1, np.zeros(10)), t0, atol=1e-9)
  np.testing.assert_allclose(g.interpolate_poses(t0, t1, np.ones(10)), t1, atol=1e-9)
  mid = g.interpolate_poses(t0, t1, np.full(10, 0.5))
  # Geodesic midpoint: equal angles to both ends, half the total.
  total = g.geodesic_angle(t0[:, :3, :3], t1[:, :3, :3])
  np.testing.assert_allclose(g.geodesic_angle(t0[:, :3, :3], mid[:, :3, :3]), total / 2, atol=1e-9)
  np.testing.assert_allclose(g.geodesic_angle(mid[:, :3, :3], t1[:, :3, :3]), total / 2, atol=1e-9)
  np.testing.assert_allclose(mid[:, :3, 3], (t0[:, :3, 3] + t1[:, :3, 3]) / 2, atol=1e-12)


def test_euler_zyx(rng):
  yaw, pitch, roll = rng.uniform(-np.pi, np.pi, 100), rng.uniform(-1.5, 1.5, 100), rng.uniform(-np.pi, np.pi, 100)
  rot = g.euler_zyx_to_matrix(yaw, pitch, roll)
  rz = g.axis_angle_to_matrix(np.stack([0 * yaw, 0 * yaw, yaw], -1))
  ry = g.axis_angle_to_matrix(np.stack([0 * yaw, pitch, 0 * yaw], -1))
  rx = g.axis_angle_to_matrix(np.stack([roll, 0 * yaw, 0 * yaw], -1))
  np.testing.assert_allclose(rot, rz @ ry @ rx, atol=1e-12)
  back = g.matrix_to_euler_zyx(rot)
  np.testing.assert_allclose(np.stack(back), np.stack([yaw, pitch, roll]), atol=1e-9)
  # Gimbal lock still round-trips the matrix.
  locked = g.euler_zyx_to_matrix(0.4, np.pi / 2, 0.3)
  np.testing.assert_allclose(g.euler_zyx_to_matrix(*g.matrix_to_euler_zyx(locked)), locked, atol=1e-7)
