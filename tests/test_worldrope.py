"""WorldRoPE's expected rotary factor: Monte Carlo, the deterministic limit, cameras behind,
gradients (the operator's pure functions; not yet wired into attention)."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import random_rotations

from jaxwm.encodings import worldrope as wr
from jaxwm.geometry.rotations import make_se3

K = np.array([[40.0, 0.0, 32.0], [0.0, 40.0, 32.0], [0.0, 0.0, 1.0]])


def _cams():
  key_cam = make_se3(np.eye(3), np.zeros(3))
  rot = random_rotations(np.random.default_rng(3), 1)[0]
  # A query camera 0.4 m to the side, turned a little, still looking at the scene.
  small = np.linalg.qr(np.eye(3) + 0.1 * (rot - rot.T))[0]
  small *= np.sign(np.diag(small))
  return key_cam, make_se3(small, np.array([0.4, -0.1, 0.2]))


def test_expected_factor_matches_monte_carlo():
  key_cam, q_cam = _cams()
  uv = jnp.array([30.0, 25.0])
  alpha = jnp.array([0.6, 0.4])
  mu, sigma = jnp.array([3.0, 5.0]), jnp.array([0.05, 0.1])
  p = 4.0
  mean, cov = wr.unproject_gaussians(uv, mu, sigma, jnp.asarray(K), jnp.asarray(key_cam), p)
  mean2, cov2, ok = wr.project_gaussians(mean, cov, jnp.asarray(K), jnp.asarray(q_cam))
  freqs = wr.mixed_frequencies(jnp.array([0.05, 0.2, 0.5, 1.0]))
  re, im = wr.expected_rotary_factor(alpha, mean2, cov2, ok, freqs)
  # Monte Carlo with the model's own assumptions: Gaussian pixel jitter of variance p^2/12
  # and Gaussian depth; exact (non-linear) unprojection and projection.
  rng = np.random.default_rng(0)
  n = 200_000
  m = rng.choice(2, size=n, p=np.asarray(alpha))
  depth = np.asarray(mu)[m] + np.asarray(sigma)[m] * rng.normal(size=n)
  pix = np.asarray(uv) + rng.normal(scale=p / np.sqrt(12), size=(n, 2))
  x = np.linalg.inv(K) @ np.concatenate([pix, np.ones((n, 1))], 1).T * depth  # key camera = world
  xc = q_cam[:3, :3].T @ (x - q_cam[:3, 3:4])
  proj = (K @ xc)[:2] / xc[2]
  ph = np.asarray(freqs) @ proj
  np.testing.assert_allclose(np.asarray(re), np.cos(ph).mean(1), atol=1e-2)
  np.testing.assert_allclose(np.asarray(im), np.sin(ph).mean(1), atol=1e-2)


def test_deterministic_limit_is_rope_at_projected_pixel():
  key_cam, q_cam = _cams()
  uv = jnp.array([12.0, 50.0])
  mean, cov = wr.unproject_gaussians(uv, jnp.array([4.0]), jnp.array([0.0]), jnp.asarray(K), jnp.asarray(key_cam),
                                     0.0)
  mean2, cov2, ok = wr.project_gaussians(mean, cov, jnp.asarray(K), jnp.asarray(q_cam))
  np.testing.assert_allclose(np.asarray(cov2), 0.0, atol=1e-12)
  x = np.linalg.inv(K) @ np.array([12.0, 50.0, 1.0]) * 4.0
  xc = q_cam[:3, :3].T @ (x - q_cam[:3, 3])
  pix = (K @ xc)[:2] / xc[2]
  np.testing.assert_allclose(np.asarray(mean2[0]), pix, rtol=1e-5)
  freqs = wr.axial_frequencies(jnp.array([0.1, 0.3]), jnp.array([0.2, 0.7]))
  re, im = wr.expected_rotary_factor(jnp.ones(1), mean2, cov2, ok, freqs)
  ph = np.asarray(freqs) @ pix
  np.testing.assert_allclose(np.asarray(re), np.cos(ph), atol=1e-5)
  np.testing.assert_allclose(np.asarray(im), np.sin(ph), atol=1e-5)


def test_hypotheses_behind_the_query_contribute_nothing():
  key_cam, _ = _cams()
  behind = make_se3(np.diag([-1.0, 1.0, -1.0]), np.array([0.0, 0.0, 0.5]))  # looks back at -z
  mean, cov = wr.unproject_gaussians(jnp.array([32.0, 32.0]), jnp.array([2.0, 3.0]), jnp.array([0.1, 0.1]),
                                     jnp.asarray(K), jnp.asarray(key_cam), 4.0)
  mean2, cov2, ok = wr.project_gaussians(mean, cov, jnp.asarray(K), jnp.asarray(behind))
  assert not np.asarray(ok).any()
  re, im = wr.expected_rotary_factor(jnp.array([0.5, 0.5]), mean2, cov2, ok, wr.mixed_frequencies(jnp.ones(3)))
  np.testing.assert_array_equal(np.asarray(re), 0.0)
  np.testing.assert_array_equal(np.asarray(im), 0.0)


def test_gradients_are_finite():
  key_cam, q_cam = _cams()

  def f(mu, sigma, logits):
    mean, cov = wr.unproject_gaussians(jnp.array([20.0, 40.0]), mu, sigma, jnp.asarray(K), jnp.asarray(key_cam), 4.0)
    mean2, cov2, ok = wr.project_gaussians(mean, cov, jnp.asarray(K), jnp.asarray(q_cam))
    re, im = wr.expected_rotary_factor(jax.nn.softmax(logits), mean2, cov2, ok, wr.mixed_frequencies(jnp.ones(4)))
    return jnp.sum(re * 0.3 + im)

  grads = jax.grad(f, argnums=(0, 1, 2))(jnp.array([2.0, 0.0]), jnp.array([0.1, 0.2]), jnp.array([0.1, -0.3]))
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
