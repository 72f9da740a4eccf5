"""validate_cameras: each error names the argument, the frame and the problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_intrinsics, random_poses

from jaxwm import geometry as g
from jaxwm.data.procedural import make_scene, render


@pytest.fixture
def cams(rng):
  return random_poses(rng, 5), random_intrinsics(rng, 5)


def test_valid_cameras_pass(cams):
  g.validate_cameras(*cams)
  g.validate_cameras(cams[0][None], cams[1][None])  # [B, F, ...]


def test_non_finite(cams):
  c2w, k = cams
  c2w[3, 0, 1] = np.nan
  with pytest.raises(ValueError, match=r"c2w at frame 3: non-finite"):
    g.validate_cameras(c2w, k)


def test_not_orthonormal(cams):
  c2w, k = cams
  c2w[2, :3, :3] *= 1.01
  with pytest.raises(ValueError, match=r"c2w at frame 2: rotation is not orthonormal .*atol 0.0001"):
    g.validate_cameras(c2w, k)


def test_reflection(cams):
  c2w, k = cams
  c2w[4, :3, 0] *= -1
  with pytest.raises(ValueError, match=r"c2w at frame 4: rotation determinant is -1"):
    g.validate_cameras(c2w, k)


def test_bad_last_row(cams):
  c2w, k = cams
  c2w[1, 3, 0] = 0.5
  with pytest.raises(ValueError, match=r"c2w at frame 1: last row"):
    g.validate_cameras(c2w, k)


def test_non_positive_focal(cams):
  c2w, k = cams
  k[0, 1, 1] = 0.0
  with pytest.raises(ValueError, match=r"intrinsics at frame 0: non-positive focal length"):
    g.validate_cameras(c2w, k)


def test_non_finite_intrinsics(cams):
  c2w, k = cams
  k[2, 0, 2] = np.inf
  with pytest.raises(ValueError, match=r"intrinsics at frame 2: non-finite"):
    g.validate_cameras(c2w, k)


def test_shapes(cams):
  c2w, k = cams
  with pytest.raises(ValueError, match=r"c2w must have shape \[\.\.\., 4, 4\]; got shape \(5, 3, 4\)"):
    g.validate_cameras(c2w[:, :3], k)
  with pytest.raises(ValueError, match=r"intrinsics must have shape"):
    g.validate_cameras(c2w, k[:, :2])
  with pytest.raises(ValueError, match=r"intrinsics leading shape \(4,\) does not match c2w leading shape \(5,\)"):
    g.validate_cameras(c2w, k[:4])


def test_batched_frame_index(cams):
  c2w, k = cams
  c2w = np.stack([c2w, c2w])
  c2w[1, 2, 0, 0] = np.inf
  with pytest.raises(ValueError, match=r"c2w at frame \(1, 2\): non-finite"):
    g.validate_cameras(c2w, np.stack([k, k]))


def test_under_jit_checks_shapes_only(cams):
  c2w, k = cams

  @jax.jit
  def f(a, b):
    g.validate_cameras(a, b)
    return a.sum()

  f(jnp.asarray(c2w), jnp.asarray(k))
  with pytest.raises(ValueError, match="must have shape"):
    f(jnp.asarray(c2w[:, :3]), jnp.asarray(k))


def test_renderer_rejects_bad_cameras(cams):
  c2w, k = cams
  c2w[0, :3, :3] *= 2
  with pytest.raises(ValueError, match=r"c2w at frame 0: rotation is not orthonormal"):
    render(make_scene(0, texture_size=32), c2w, k, (8, 8))
