"""jaxwm.ops.sincos against float64 numpy: values, special arguments, and its derivative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.ops.sincos import sincos


@pytest.mark.parametrize("limit", [1.0, 60.0, 2e4])
def test_sincos_matches_float64(limit):
  rng = np.random.default_rng(int(limit))
  x = np.concatenate([rng.uniform(-limit, limit, 200_000), np.linspace(-limit, limit, 20_001),
                      np.pi / 4 * np.arange(-40, 41)]).astype(np.float32)
  s, c = jax.jit(sincos)(x)
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(np.asarray(s), np.sin(x64), rtol=0, atol=2e-7)
  np.testing.assert_allclose(np.asarray(c), np.cos(x64), rtol=0, atol=2e-7)


def test_sincos_special_arguments():
  s, c = sincos(jnp.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e10, -3e38, 3e38], jnp.float32))
  s, c = np.asarray(s), np.asarray(c)
  assert (s[:2] == 0).all() and (c[:2] == 1).all()
  assert np.isnan(s[2:5]).all() and np.isnan(c[2:5]).all()  # as jnp.sin / jnp.cos
  assert (np.abs(s[5:]) <= 1).all() and (np.abs(c[5:]) <= 1).all()  # unreducible in float32, but bounded


def test_sincos_derivative_is_the_exact_one():
  x = jnp.linspace(-50.0, 50.0, 1001, dtype=jnp.float32)
  ds = jax.vmap(jax.grad(lambda a: sincos(a)[0]))(x)
  dc = jax.vmap(jax.grad(lambda a: sincos(a)[1]))(x)
  x64 = np.asarray(x, np.float64)
  np.testing.assert_allclose(np.asarray(ds), np.cos(x64), rtol=0, atol=2e-7)
  np.testing.assert_allclose(np.asarray(dc), -np.sin(x64), rtol=0, atol=2e-7)
  # second order through the custom rule: d2 sin = -sin
  d2 = jax.vmap(jax.grad(jax.grad(lambda a: sincos(a)[0])))(x)
  np.testing.assert_allclose(np.asarray(d2), -np.sin(x64), rtol=0, atol=2e-7)
