"""WorldRoPE's expected rotary factor: Monte Carlo, the deterministic limit, cameras behind,
the projected covariance against float64 finite differences, the bound |factor| <= 1 under jit, gradients."""

import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_rotations

from jaxwm import kernels
from jaxwm.encodings import worldrope as wr
from jaxwm.geometry.rotations import make_se3
from jaxwm.ops import attention as attn_ref
from jaxwm.ops import view_factors as vf

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
  mean, root = wr.unproject_gaussians(uv, mu, sigma, jnp.asarray(K), jnp.asarray(key_cam), p)
  mean2, root2, ok = vf.project_gaussians(mean, root, jnp.asarray(K), jnp.asarray(q_cam))
  freqs = wr.mixed_frequencies(jnp.array([0.05, 0.2, 0.5, 1.0]))
  re, im = vf.expected_rotary_factor(alpha, mean2, root2, ok, freqs)
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
  mean, root = wr.unproject_gaussians(uv, jnp.array([4.0]), jnp.array([0.0]), jnp.asarray(K), jnp.asarray(key_cam),
                                     0.0)
  mean2, root2, ok = vf.project_gaussians(mean, root, jnp.asarray(K), jnp.asarray(q_cam))
  np.testing.assert_allclose(np.asarray(root2), 0.0, atol=1e-12)
  x = np.linalg.inv(K) @ np.array([12.0, 50.0, 1.0]) * 4.0
  xc = q_cam[:3, :3].T @ (x - q_cam[:3, 3])
  pix = (K @ xc)[:2] / xc[2]
  np.testing.assert_allclose(np.asarray(mean2[0]), pix, rtol=1e-5)
  freqs = wr.axial_frequencies(jnp.array([0.1, 0.3]), jnp.array([0.2, 0.7]))
  re, im = vf.expected_rotary_factor(jnp.ones(1), mean2, root2, ok, freqs)
  ph = np.asarray(freqs) @ pix
  np.testing.assert_allclose(np.asarray(re), np.cos(ph), atol=1e-5)
  np.testing.assert_allclose(np.asarray(im), np.sin(ph), atol=1e-5)


def test_hypotheses_behind_the_query_contribute_nothing():
  key_cam, _ = _cams()
  behind = make_se3(np.diag([-1.0, 1.0, -1.0]), np.array([0.0, 0.0, 0.5]))  # looks back at -z
  mean, root = wr.unproject_gaussians(jnp.array([32.0, 32.0]), jnp.array([2.0, 3.0]), jnp.array([0.1, 0.1]),
                                     jnp.asarray(K), jnp.asarray(key_cam), 4.0)
  mean2, root2, ok = vf.project_gaussians(mean, root, jnp.asarray(K), jnp.asarray(behind))
  assert not np.asarray(ok).any()
  re, im = vf.expected_rotary_factor(jnp.array([0.5, 0.5]), mean2, root2, ok, wr.mixed_frequencies(jnp.ones(3)))
  np.testing.assert_array_equal(np.asarray(re), 0.0)
  np.testing.assert_array_equal(np.asarray(im), 0.0)


def test_gradients_are_finite():
  key_cam, q_cam = _cams()

  def f(mu, sigma, logits):
    mean, root = wr.unproject_gaussians(jnp.array([20.0, 40.0]), mu, sigma, jnp.asarray(K), jnp.asarray(key_cam), 4.0)
    mean2, root2, ok = vf.project_gaussians(mean, root, jnp.asarray(K), jnp.asarray(q_cam))
    re, im = vf.expected_rotary_factor(jax.nn.softmax(logits), mean2, root2, ok, wr.mixed_frequencies(jnp.ones(4)))
    return jnp.sum(re * 0.3 + im)

  grads = jax.grad(f, argnums=(0, 1, 2))(jnp.array([2.0, 0.0]), jnp.array([0.1, 0.2]), jnp.array([0.1, -0.3]))
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()


def test_projected_covariance_matches_float64_jacobian():
  """``root2 root2^T`` equals ``J_pi cov J_pi^T`` with ``J_pi`` by float64 central differences of the projection."""
  key_cam, q_cam = _cams()
  uv, mu, sigma, p = np.array([20.0, 40.0]), 3.0, 0.2, 4.0
  mean, root = wr.unproject_gaussians(jnp.asarray(uv), jnp.array([mu]), jnp.array([sigma]), jnp.asarray(K),
                                      jnp.asarray(key_cam), p)
  _, root2, _ = vf.project_gaussians(mean, root, jnp.asarray(K), jnp.asarray(q_cam))
  got = np.asarray(root2[0], np.float64) @ np.asarray(root2[0], np.float64).T

  def lift(a):  # (u, v, depth) -> world point (key camera = world)
    return np.linalg.inv(K) @ np.array([a[0], a[1], 1.0]) * a[2]

  def proj(x):
    xc = q_cam[:3, :3].T @ (x - q_cam[:3, 3])
    return (K @ xc)[:2] / xc[2]

  a0, h = np.array([uv[0], uv[1], mu]), 1e-5
  full = np.stack([(proj(lift(a0 + h * e)) - proj(lift(a0 - h * e))) / (2 * h) for e in np.eye(3)], 1)
  want = full @ np.diag([p**2 / 12, p**2 / 12, sigma**2]) @ full.T
  np.testing.assert_allclose(got, want, rtol=1e-4)


def test_factor_is_bounded_under_jit_for_extreme_geometry():
  """Near-plane and off-axis hypotheses, big spreads, all frequencies: ``|factor| <= sum alpha`` in a jitted,
  batched call like attention's (an earlier ``J cov J^T`` form overflowed ``exp`` there)."""
  rng = np.random.default_rng(1)
  rots = random_rotations(rng, 6)
  q_cams = np.stack([make_se3(r, np.zeros(3)) for r in rots])[:, None]  # [F, 1, 4, 4]: same centre (rotations)
  n, m = 64, 4
  uv = jnp.asarray(rng.uniform(0, 64, (n, 2)))
  mu = jnp.asarray(rng.choice([0.0, 1e-6, 1e-3, 0.5, 3.0, 40.0], (n, m)))
  sigma = jnp.asarray(rng.choice([1e-3, 0.3, 5.0, 50.0], (n, m)))
  freqs = wr.axial_frequencies(jnp.asarray(np.geomspace(1e-4, 1, 8)), jnp.asarray(np.geomspace(1e-4, 1, 8)))

  @jax.jit
  def f(uv, mu, sigma):
    mean, root = wr.unproject_gaussians(uv, mu, sigma, jnp.asarray(K), jnp.asarray(make_se3(np.eye(3), np.zeros(3))),
                                        4.0)
    mean2, root2, ok = vf.project_gaussians(mean[None], root[None], jnp.asarray(K), jnp.asarray(q_cams))
    return vf.expected_rotary_factor(jnp.full((m,), 0.25), mean2 / 4.0, root2 / 4.0, ok, freqs)

  re, im = f(uv, mu, sigma)
  mag = np.hypot(np.asarray(re), np.asarray(im))
  assert np.isfinite(mag).all()
  assert mag.max() <= 1.0 + 1e-5


@pytest.mark.parametrize("impl", ["xla", "xla_lse", "cpu_flash"])
def test_per_view_attention_matches_per_frame_dense_attention(impl):
  """Each query frame attends over keys whose ``channels`` are rotated by its own view's factors: float64 dense
  attention per frame, for every impl of the per-view form."""
  if impl == "cpu_flash" and shutil.which("g++") is None:
    pytest.skip("cpu_flash builds its kernel with g++")
  rng = np.random.default_rng(2)
  b, fq, n, lk, h, d = 2, 3, 4, 10, 2, 8
  pairs = (1, 3)
  channels = attn_ref.pair_channels(pairs)  # [2, 3, 6, 7]
  q = rng.normal(size=(b, fq * n, h, d)).astype(np.float32)
  k = rng.normal(size=(b, lk, h, d)).astype(np.float32)
  v = rng.normal(size=(b, lk, h, d)).astype(np.float32)
  factors = rng.normal(size=(b, fq, lk, len(pairs), 2)).astype(np.float32)
  mask = rng.random((b, fq * n, lk)) < 0.7
  mask[..., 0] = True
  got = np.asarray(jax.jit(lambda *a: kernels.per_view_attention(*a[:4], pairs, a[4], scale=d**-0.5, impl=impl))(
      *map(jnp.asarray, (q, k, v, factors, mask))))
  want = np.zeros_like(got, np.float64)
  for f in range(fq):
    kf = k.astype(np.float64).copy()
    complex_pairs = kf[..., channels[0::2]] + 1j * kf[..., channels[1::2]]  # [b, lk, h, P]
    turned = complex_pairs * (factors[:, f, :, None, :, 0] + 1j * factors[:, f, :, None, :, 1])
    kf[..., channels[0::2]], kf[..., channels[1::2]] = turned.real, turned.imag
    rows = slice(f * n, (f + 1) * n)
    logit = np.einsum("bqhd,bkhd->bhqk", q[:, rows].astype(np.float64), kf) / np.sqrt(d)
    logit = np.where(mask[:, None, rows], logit, -np.inf)
    p = np.exp(logit - logit.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want[:, rows] = np.einsum("bhqk,bkhd->bqhd", p, v.astype(np.float64))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_per_view_keys_equal_the_vectorised_ones():
  """``transform_keys(per_view=True)`` (the sampler's cache views: a loop over views, terms written out, the
  polynomial sincos) gives the vectorised form's values: odd key counts, 1 and 3 hypotheses, mixed and axial
  frequencies, scattered pairs, a view that sees some hypotheses from behind, float32 and bfloat16 keys."""
  rng = np.random.default_rng(7)
  head_dim = 32  # RoPE pairs 6..15 are h/w
  for b, lk, m, fq, pairs, mixed, dtype in [(2, 13, 3, 3, list(range(6, 16)), False, jnp.float32),
                                            (1, 7, 1, 2, [9, 6, 14], True, jnp.float32),
                                            (1, 9, 3, 1, [7, 12], False, jnp.bfloat16)]:
    freqs = wr.hw_frequencies(head_dim, pairs, mixed=mixed)
    key_cam = np.tile(make_se3(np.eye(3), np.zeros(3)), (b, lk, 1, 1))
    mean, root = wr.unproject_gaussians(jnp.asarray(rng.uniform(0, 64, (b, lk, 2)), jnp.float32),
                                        jnp.asarray(rng.uniform(0.5, 6, (b, lk, m)), jnp.float32),
                                        jnp.asarray(rng.uniform(0.0, 0.5, (b, lk, m)), jnp.float32),
                                        jnp.asarray(np.tile(K, (b, lk, 1, 1)), jnp.float32), jnp.asarray(key_cam,
                                                                                                     jnp.float32), 4.0)
    gauss = {"mean": mean, "root": root, "alpha": jax.nn.softmax(jnp.asarray(rng.normal(size=(b, lk, m)),
                                                                             jnp.float32))}
    rots = random_rotations(rng, fq)
    q_c2w = np.stack([make_se3(r, rng.normal(size=3) * 0.5) for r in rots])
    q_c2w[0] = make_se3(np.diag([1.0, -1.0, -1.0]), np.array([0.0, 0.0, 3.0]))  # turned round: some behind it
    q_c2w = jnp.asarray(np.tile(q_c2w, (b, 1, 1, 1)), jnp.float32)
    q_k = jnp.asarray(np.tile(K, (b, fq, 1, 1)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, lk, 4, head_dim)), dtype)
    want = wr.transform_keys(k, gauss, q_k, q_c2w, freqs, pairs, 4.0)
    got = jax.jit(lambda k_, g_: wr.transform_keys(k_, g_, q_k, q_c2w, freqs, pairs, 4.0, per_view=True))(k, gauss)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=0, atol=tol)
    assert float(jnp.max(jnp.abs(want.astype(jnp.float32)))) > 0.1  # not all attenuated away


def _split_case(seed, b, fq, n, lc, lo, h, d, pairs, head_mask=False, empty_cache_rows=False):
  rng = np.random.default_rng(seed)
  channels = attn_ref.pair_channels(pairs)
  arr = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # pylint: disable=unnecessary-lambda-assignment
  cache = (arr(b, lc, h, d), arr(b, fq, lc, h, len(channels)), arr(b, lc, h, d))
  own = (arr(b, lo, h, d), arr(b, fq, lo, h, len(channels)), arr(b, lo, h, d))
  shape = (b, h, fq * n, lc + lo) if head_mask else (b, fq * n, lc + lo)
  mask = rng.random(shape) < 0.6
  mask[..., lc] = True  # every query sees at least its first own key
  if empty_cache_rows:
    mask[..., : fq * n // 2, :lc] = False  # these queries see no cached key (the first chunk of a walk)
  return arr(b, fq * n, h, d), cache, own, jnp.asarray(mask), channels


@pytest.mark.parametrize("case", [dict(b=1, fq=2, n=4, lc=24, lo=8, h=2, d=8, pairs=[1, 3]),
                                  dict(b=2, fq=3, n=3, lc=7, lo=9, h=3, d=12, pairs=[0, 2, 5], head_mask=True),
                                  dict(b=2, fq=1, n=5, lc=11, lo=5, h=1, d=6, pairs=[2], empty_cache_rows=True)])
def test_attention_over_cache_and_own_blocks_equals_the_concatenation(case):
  """The sampler's per-view attention with the cache kept apart from the own chunk (a softmax over two blocks
  with one shared maximum) equals float64 dense attention per query frame, and the reference's per-view attention on
  the concatenated keys in values and in the gradients of every input (DMD differentiates the student's forward
  through it), with masks per query or per head, odd sizes and queries that see no cached key."""
  n = case["n"]
  q, cache, own, mask, channels = _split_case(0, **case)
  split = lambda q_, c_, o_: wr.per_view_attention_cached(q_, c_, o_, mask, channels)  # pylint: disable=unnecessary-lambda-assignment

  def joined(q_, c_, o_):  # the reference's per-view attention over the concatenated keys and views
    cat = lambda i, axis: jnp.concatenate([c_[i], o_[i]], axis)  # pylint: disable=unnecessary-lambda-assignment
    rest = np.setdiff1d(np.arange(q_.shape[-1]), channels)
    logits = functools.partial(attn_ref.per_view_logits, scale=q_.shape[-1] ** -0.5)
    args = (q_[..., channels], cat(1, 2), q_[..., rest], cat(0, 1)[..., rest])
    return attn_ref.softmax_attention(logits, args, cat(2, 1), mask)

  got = np.asarray(split(q, cache, own))
  np.testing.assert_allclose(got, np.asarray(joined(q, cache, own)), atol=2e-6)
  # and against float64 dense attention per query frame, each frame's keys carrying its own view's channels
  f64 = lambda a: np.asarray(a, np.float64)  # pylint: disable=unnecessary-lambda-assignment
  k = np.concatenate([f64(cache[0]), f64(own[0])], 1)
  views = np.concatenate([f64(cache[1]), f64(own[1])], 2)
  v = np.concatenate([f64(cache[2]), f64(own[2])], 1)
  m = np.asarray(mask)
  m = m if m.ndim == 4 else m[:, None]
  want = np.zeros(got.shape)
  for f in range(views.shape[1]):
    kf = k.copy()
    kf[..., channels] = views[:, f]
    rows = slice(f * n, (f + 1) * n)
    logit = np.einsum("bqhd,bkhd->bhqk", f64(q)[:, rows], kf) / np.sqrt(q.shape[-1])
    logit = np.where(m[:, :, rows], logit, -np.inf)
    p = np.exp(logit - logit.max(-1, keepdims=True))
    want[:, rows] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
  np.testing.assert_allclose(got, want, atol=2e-5)
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  grads = [jax.grad(lambda *a, f=f: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(q, cache, own) for f in (split, joined)]
  for got, want in zip(jax.tree_util.tree_leaves(grads[0]), jax.tree_util.tree_leaves(grads[1])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
