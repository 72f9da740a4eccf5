"""WorldRoPE's expected rotary factor of every key in every query view: the pure-``jnp`` reference
(``jaxwm.kernels.view_factors`` dispatches between it and the C++ kernel ``xla_kernels.cpu_view_factors``).

A key token's depth hypothesis ``m`` is a world Gaussian (mean ``X``, covariance ``root root^T``; built by
``jaxwm.encodings.worldrope.unproject_gaussians``). Projected into a query camera to first order,

    mu' = pi(X),   Sigma' = J_pi root root^T J_pi^T        (J_pi = d pi / d X at X; behind the camera: weight 0)

and a rotary frequency ``w`` (a 2-vector in token-grid units) gets the expected factor

    E[exp(i w . u)] = sum_m alpha_m exp(i w . mu'_m - w^T Sigma'_m w / 2)

(docs/design.md §4), one complex number per key, view and channel pair.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops.sincos import sincos


def project_gaussians(mean, root, intrinsics, c2w, eps=1e-6):
  """First-order projection of world Gaussians into a camera.

  Args:
    mean: ``[..., M, 3]``; root: ``[..., M, 3, R]`` covariance roots (``cov = root root^T``);
      intrinsics ``[..., 3, 3]``, c2w ``[..., 4, 4]`` of the query camera (leading dims broadcast
      against the Gaussians').

  Returns:
    ``(mean2 [..., M, 2] pixels, root2 [..., M, 2, R], in_front [..., M] bool)``; the projected covariance is
    ``Sigma' = J_pi cov J_pi^T = root2 root2^T``. Hypotheses behind the camera get ``mean2 = root2 = 0``.
  """
  rot, origin = c2w[..., :3, :3], c2w[..., :3, 3]
  xc = jnp.einsum("...ji,...mj->...mi", rot, mean - origin[..., None, :])  # R^T (X - o)
  z = xc[..., 2]
  in_front = z > eps
  zs = jnp.where(in_front, z, 1.0)
  k = intrinsics[..., None, :, :]
  fx, fy, cx, cy, sk = k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2], k[..., 0, 1]
  x, y = xc[..., 0] / zs, xc[..., 1] / zs
  mean2 = jnp.where(in_front[..., None], jnp.stack([fx * x + sk * y + cx, fy * y + cy], -1), 0.0)
  zero = jnp.zeros_like(x)
  # d(u, v) / d(x_c, y_c, z_c)
  jc = jnp.stack([jnp.stack([fx / zs, sk / zs, -(fx * x + sk * y) / zs], -1),
                  jnp.stack([zero, fy / zs, -fy * y / zs], -1)], -2)
  # chain with d x_c / d X = R^T, then the root: [..., M, 2, R]
  root_c = jnp.einsum("...ji,...mjr->...mir", rot, root)  # R^T root
  root2 = jnp.einsum("...mic,...mcr->...mir", jc, root_c)
  return mean2, jnp.where(in_front[..., None, None], root2, 0.0), in_front


def expected_rotary_factor(alpha, mean2, root2, valid, freqs):
  """``sum_m alpha_m valid_m exp(i w . mu'_m - w^T Sigma'_m w / 2)`` per frequency.

  Args:
    alpha: ``[..., M]`` hypothesis weights; mean2 ``[..., M, 2]`` and the covariance roots root2
      ``[..., M, 2, R]`` (``Sigma' = root2 root2^T``) in the units of the frequencies; valid ``[..., M]``
      (False: behind the query camera).
    freqs: ``[P, 2]`` frequency vectors (axial ``[w, 0]`` / ``[0, w]``, or mixed).

  Returns:
    ``(real, imag)``, each ``[..., P]``. ``Sigma'`` is built from its root (diagonal entries are sums of
    squares) and ``w^T Sigma' w`` is clamped at 0, so the attenuation is at most 1 (a triple product
    ``J cov J^T`` lost its symmetry under XLA's CPU fusion and overflowed ``exp``).
  """
  phase = jnp.einsum("...mi,pi->...mp", mean2, freqs)
  # Sigma' entries from the root (uu, vv >= 0 exactly; uv by Cauchy-Schwarz), then w^T Sigma' w per frequency
  # as one small contraction; clamped at 0 against rounding.
  cov3 = jnp.stack([jnp.sum(jnp.square(root2[..., 0, :]), -1), jnp.sum(jnp.square(root2[..., 1, :]), -1),
                    2.0 * jnp.sum(root2[..., 0, :] * root2[..., 1, :], -1)], -1)  # [..., M, 3]
  f = jnp.asarray(freqs)
  fq = jnp.stack([f[:, 0]**2, f[:, 1]**2, f[:, 0] * f[:, 1]], 0)  # [3, P]
  quad = jnp.maximum(jnp.einsum("...mc,cp->...mp", cov3, fq), 0.0)
  w = (alpha * valid)[..., None] * jnp.exp(-0.5 * quad)
  return jnp.sum(w * jnp.cos(phase), -2), jnp.sum(w * jnp.sin(phase), -2)


def _project_terms(mean, root, intrinsics, c2w, eps=1e-6):
  """:func:`project_gaussians` with every 3x3 product written out term by term (the same maths; XLA:CPU fuses
  these into one loop, where it runs the einsums as thousands of batched 3x3 dots)."""
  rot = c2w[..., None, :3, :3]  # [..., 1, 3, 3] against the hypotheses' [..., M, 3]
  d = mean - c2w[..., None, :3, 3]
  xc = [sum(rot[..., j, i] * d[..., j] for j in range(3)) for i in range(3)]  # R^T (X - o)
  in_front = xc[2] > eps
  zs = jnp.where(in_front, xc[2], 1.0)
  k = intrinsics[..., None, :, :]
  fx, fy, cx, cy, sk = k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2], k[..., 0, 1]
  x, y = xc[0] / zs, xc[1] / zs
  mean2 = jnp.where(in_front[..., None], jnp.stack([fx * x + sk * y + cx, fy * y + cy], -1), 0.0)
  # rows of d(u, v) / d(x_c, y_c, z_c) chained with d x_c / d X = R^T: a_i[c] = sum_j jc[i, j] R[c, j]
  jc = ((fx / zs, sk / zs, -(fx * x + sk * y) / zs), (None, fy / zs, -fy * y / zs))
  a = [[sum(row[j] * rot[..., c, j] for j in range(3) if row[j] is not None) for c in range(3)] for row in jc]
  root2 = jnp.stack([sum(ai[c][..., None] * root[..., c, :] for c in range(3)) for ai in a], -2)  # [..., M, 2, R]
  return mean2, jnp.where(in_front[..., None, None], root2, 0.0), in_front


def _factor_terms(alpha, mean2, root2, valid, freqs):
  """:func:`expected_rotary_factor` with the small axes summed term by term and :func:`jaxwm.ops.sincos.sincos`
  (the same maths; a reduction over the hypotheses ran 8x slower on XLA:CPU, ``jnp.sin`` / ``jnp.cos`` 2x)."""
  f = np.asarray(freqs, np.float32)
  fu, fv = f[:, 0], f[:, 1]
  phase = mean2[..., 0:1] * fu + mean2[..., 1:2] * fv  # [..., M, P]
  r0 = [root2[..., 0, c] for c in range(root2.shape[-1])]
  r1 = [root2[..., 1, c] for c in range(root2.shape[-1])]
  uu, vv, uv = sum(a * a for a in r0), sum(b * b for b in r1), sum(a * b for a, b in zip(r0, r1))
  quad = jnp.maximum(uu[..., None] * fu**2 + vv[..., None] * fv**2 + (2.0 * uv)[..., None] * (fu * fv), 0.0)
  w = (alpha * valid)[..., None] * jnp.exp(-0.5 * quad)
  sin, cos = sincos(phase)
  wc, ws = w * cos, w * sin
  m = range(alpha.shape[-1])
  return sum(wc[..., i, :] for i in m), sum(ws[..., i, :] for i in m)


def view_factors(gauss, q_intrinsics, q_c2w, freqs, pixels_per_token, per_view=False):
  """The expected rotary factor of every key in each query view: ``factors [B, Fq, Lk, P, 2]`` (re, im) float32, for
  the key Gaussians ``gauss`` (``mean [B, Lk, M, 3]``, ``root``, ``alpha``) projected into the query cameras
  ``q_intrinsics [B, Fq, 3, 3]``, ``q_c2w [B, Fq, 4, 4]`` (token-grid units), at the frequencies ``freqs [P, 2]``.

  ``per_view=True`` (the sampler: :meth:`WorldRoPE.cache_views`, and the chunk's own keys in its forwards): the
  same values from a loop over the query views with the factor's terms written out (:func:`_project_terms`,
  :func:`_factor_terms`), so that XLA computes each factor once (fused into the keys' product, it was recomputed
  for every head and channel): 5x faster forward on CPU (BENCHMARKS.md, "WorldRoPE's views of the sampler's
  cache"). Its backward is slower than the vectorised form's, which training keeps.
  """
  s = pixels_per_token
  if per_view:
    def view(cams):  # one query view's factor [B, Lk, P]
      mean2, root2, ok = _project_terms(gauss["mean"], gauss["root"], cams[0][:, None], cams[1][:, None])
      return _factor_terms(gauss["alpha"], mean2 / s - 0.5, root2 / s, ok, freqs)

    re, im = jax.lax.map(view, (jnp.swapaxes(q_intrinsics, 0, 1), jnp.swapaxes(q_c2w, 0, 1)))  # [Fq, B, Lk, P]
    re, im = jnp.swapaxes(re, 0, 1), jnp.swapaxes(im, 0, 1)
  else:
    mean2, root2, ok = project_gaussians(gauss["mean"][:, None], gauss["root"][:, None], q_intrinsics[:, :, None],
                                         q_c2w[:, :, None])
    # pixel -> token-grid coordinates (token centres at integers)
    re, im = expected_rotary_factor(gauss["alpha"][:, None], mean2 / s - 0.5, root2 / s, ok,
                                    jnp.asarray(freqs))  # [B, Fq, Lk, P]
  return jnp.stack([re, im], -1)
