"""WorldRoPE's expected rotary factor (WorldRoPE §3; the paper's equations are missing from
its text, so this follows the project's reading in DESIGN §4).

A key token carries ``M`` depth hypotheses (weights ``alpha``, depths ``mu``, spreads
``sigma``). Each is a world-space Gaussian: centre ``X = o + mu R K^-1 [u, v, 1]`` and covariance
``J diag(s^2, s^2, sigma^2) J^T`` with ``J = dX / d(u, v, depth)`` and ``s^2 = p^2 / 12`` (a
uniform patch of ``p`` pixels). Projected into a query view to first order (mean ``mu'``,
covariance ``Sigma' = J_pi Sigma J_pi^T``; a hypothesis behind the query camera gets weight 0),
a rotary frequency ``w`` (a 2-vector in token-grid units) has the expected factor

    E[exp(i w . u)] = sum_m alpha_m exp(i w . mu'_m - w^T Sigma'_m w / 2),

one complex number per channel pair: a rotation scaled by an attenuation. With every
covariance -> 0 and ``M = 1`` it is the ordinary rotation at the projected point.

In attention (``jaxwm.models.transformer.Attention``) keys keep only the temporal RoPE; a
linear head on each key token's input gives its hypotheses; for every query frame the keys'
h/w pairs are multiplied by their expected factor in that view (:func:`transform_keys`) and
each query frame attends with its own keys (:func:`per_view_attention`). The KV cache keeps
the pre-transform keys and each key's Gaussians.
"""

import jax.numpy as jnp


def unproject_gaussians(uv, mu, sigma, intrinsics, c2w, patch_pixels):
  """World Gaussians of depth hypotheses.

  Args:
    uv: ``[..., 2]`` pixel centres of the key tokens.
    mu, sigma: ``[..., M]`` depths (z-depth, >= 0) and their standard deviations.
    intrinsics: ``[..., 3, 3]``; c2w: ``[..., 4, 4]`` of the key's camera.
    patch_pixels: ``p``, the token's footprint in pixels (position variance ``p^2 / 12``).

  Returns:
    ``(mean [..., M, 3], cov [..., M, 3, 3])``.
  """
  k_inv = jnp.linalg.inv(intrinsics)
  rot, origin = c2w[..., :3, :3], c2w[..., :3, 3]
  ray = jnp.einsum("...ij,...j->...i", rot @ k_inv, jnp.concatenate([uv, jnp.ones_like(uv[..., :1])], -1))
  du = (rot @ k_inv)[..., :, 0]  # dX/du per unit depth
  dv = (rot @ k_inv)[..., :, 1]
  mean = origin[..., None, :] + mu[..., None] * ray[..., None, :]
  jac = jnp.stack([mu[..., None] * du[..., None, :], mu[..., None] * dv[..., None, :],
                   jnp.broadcast_to(ray[..., None, :], mean.shape)], -1)  # [..., M, 3, 3] columns u, v, depth
  s2 = patch_pixels**2 / 12.0
  var = jnp.stack([jnp.full_like(sigma, s2), jnp.full_like(sigma, s2), sigma**2], -1)
  cov = jnp.einsum("...ij,...j,...kj->...ik", jac, var, jac)
  return mean, cov


def project_gaussians(mean, cov, intrinsics, c2w, eps=1e-6):
  """First-order projection of world Gaussians into a camera.

  Args:
    mean: ``[..., M, 3]``; cov: ``[..., M, 3, 3]``; intrinsics ``[..., 3, 3]``, c2w ``[..., 4, 4]``
      of the query camera (leading dims broadcast against the Gaussians').

  Returns:
    ``(mean2 [..., M, 2] pixels, cov2 [..., M, 2, 2], in_front [..., M] bool)``.
  """
  rot, origin = c2w[..., :3, :3], c2w[..., :3, 3]
  xc = jnp.einsum("...ji,...mj->...mi", rot, mean - origin[..., None, :])  # R^T (X - o)
  z = xc[..., 2]
  in_front = z > eps
  zs = jnp.where(in_front, z, 1.0)
  k = intrinsics[..., None, :, :]
  fx, fy, cx, cy, sk = k[..., 0, 0], k[..., 1, 1], k[..., 0, 2], k[..., 1, 2], k[..., 0, 1]
  x, y = xc[..., 0] / zs, xc[..., 1] / zs
  mean2 = jnp.stack([fx * x + sk * y + cx, fy * y + cy], -1)
  zero = jnp.zeros_like(x)
  # d(u, v) / d(x_c, y_c, z_c)
  jc = jnp.stack([jnp.stack([fx / zs, sk / zs, -(fx * x + sk * y) / zs], -1),
                  jnp.stack([zero, fy / zs, -fy * y / zs], -1)], -2)
  jac = jnp.einsum("...mij,...kj->...mik", jc, rot)  # chain with d x_c / d X = R^T
  cov2 = jac @ cov @ jnp.swapaxes(jac, -1, -2)
  return mean2, cov2, in_front


def expected_rotary_factor(alpha, mean2, cov2, valid, freqs):
  """``sum_m alpha_m valid_m exp(i w . mu'_m - w^T Sigma'_m w / 2)`` per frequency.

  Args:
    alpha: ``[..., M]`` hypothesis weights; mean2 ``[..., M, 2]``, cov2 ``[..., M, 2, 2]`` in the
      units of the frequencies; valid ``[..., M]`` (False: behind the query camera).
    freqs: ``[P, 2]`` frequency vectors (axial ``[w, 0]`` / ``[0, w]``, or mixed).

  Returns:
    ``(real, imag)``, each ``[..., P]``.
  """
  phase = jnp.einsum("...mi,pi->...mp", mean2, freqs)
  quad = jnp.einsum("pi,...mij,pj->...mp", freqs, cov2, freqs)
  w = (alpha * valid)[..., None] * jnp.exp(-0.5 * quad)
  return jnp.sum(w * jnp.cos(phase), -2), jnp.sum(w * jnp.sin(phase), -2)


def axial_frequencies(freqs_h, freqs_w):
  """Axial 2-D frequencies: ``[w_h, ...]`` along rows (v), then ``[w_w, ...]`` along columns (u): ``[P, 2]``."""
  fh = jnp.stack([jnp.zeros_like(freqs_h), freqs_h], -1)
  fw = jnp.stack([freqs_w, jnp.zeros_like(freqs_w)], -1)
  return jnp.concatenate([fh, fw], 0)


def mixed_frequencies(magnitudes, golden=2.399963229728653):
  """Mixed 2-D frequencies: magnitudes along golden-angle directions ``[P, 2]``."""
  ang = golden * jnp.arange(magnitudes.shape[0])
  return jnp.stack([magnitudes * jnp.cos(ang), magnitudes * jnp.sin(ang)], -1)


def hw_frequencies(head_dim, pair_idx, theta=10000.0, mixed=False):
  """2-D frequency vector (token-grid units, ``(u, v)``) of each h/w channel pair in ``pair_idx``.

  The backbone's h pairs rotate with the row (``v``) and w pairs with the column (``u``);
  ``mixed`` keeps each pair's magnitude and turns it to a golden-angle direction.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxwm.encodings.rope3d import rope_axis_dims, rope_frequencies  # pylint: disable=g-import-not-at-top
  t, h, w = rope_axis_dims(head_dim)
  fh, fw = rope_frequencies(h, theta), rope_frequencies(w, theta)
  out = []
  for p in pair_idx:
    c = 2 * p
    if c < t:
      raise ValueError(f"WorldRoPE channel {c} is a temporal RoPE channel; WorldRoPE acts on the h/w channels")
    out.append((0.0, fh[(c - t) // 2]) if c < t + h else (fw[(c - t - h) // 2], 0.0))
  f = np.asarray(out)
  if mixed:
    mag = np.linalg.norm(f, axis=-1)
    ang = 2.399963229728653 * np.arange(len(f))
    f = np.stack([mag * np.cos(ang), mag * np.sin(ang)], -1)
  return f.astype(np.float32)


def key_gaussians(raw, uv, intrinsics, c2w, patch_pixels, depth_init):
  """Depth-head outputs -> world Gaussians of each key token.

  Args:
    raw: ``[B, L, 3M]`` linear-head outputs (alpha logits, depth, log spread).
    uv: ``[L, 2]`` token pixel centres; intrinsics ``[B, L, 3, 3]``, c2w ``[B, L, 4, 4]`` per token.
    depth_init: ``[M]`` initial depths (biases).

  Returns:
    dict with ``mean [B, L, M, 3]``, ``cov [B, L, M, 3, 3]``, ``alpha [B, L, M]``.
  """
  m = depth_init.shape[0]
  logits, d, log_s = raw[..., :m], raw[..., m:2 * m], raw[..., 2 * m:]
  mu = jnp.maximum(d + depth_init, 0.0)
  sigma = jnp.exp(log_s - 1.0)
  mean, cov = unproject_gaussians(jnp.broadcast_to(uv, raw.shape[:2] + (2,)), mu, sigma, intrinsics, c2w,
                                  patch_pixels)
  return {"mean": mean, "cov": cov, "alpha": jax_softmax(logits)}


def jax_softmax(x):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.nn.softmax(x, axis=-1)


def transform_keys(k, gauss, q_intrinsics, q_c2w, freqs, pair_idx, pixels_per_token):
  """Keys as seen from each query view: ``k [B, Lk, H, D]`` -> ``[B, Fq, Lk, H, D]``.

  The pairs ``pair_idx`` of every key are multiplied (as complex numbers) by the expected
  rotary factor of the key's Gaussians projected into query view ``f`` (token-grid units).
  """
  mean = gauss["mean"][:, None]  # [B, 1, Lk, M, 3]
  cov = gauss["cov"][:, None]
  kq = q_intrinsics[:, :, None]  # [B, Fq, 1, 3, 3]
  cq = q_c2w[:, :, None]
  mean2, cov2, ok = project_gaussians(mean, cov, kq, cq)
  s = pixels_per_token
  mean2 = mean2 / s - 0.5  # pixel -> token-grid coordinates (token centres at integers)
  cov2 = cov2 / (s * s)
  re, im = expected_rotary_factor(gauss["alpha"][:, None], mean2, cov2, ok, jnp.asarray(freqs))  # [B, Fq, Lk, P]
  pairs = jnp.asarray(pair_idx)
  kp = k.astype(jnp.float32).reshape(k.shape[:-1] + (k.shape[-1] // 2, 2))[:, :, :, pairs]  # [B, Lk, H, P, 2]
  k0, k1 = kp[None, ..., 0].swapaxes(0, 1), kp[None, ..., 1].swapaxes(0, 1)  # [B, 1, Lk, H, P]
  re, im = re[:, :, :, None, :], im[:, :, :, None, :]
  new = jnp.stack([k0 * re - k1 * im, k0 * im + k1 * re], -1)  # [B, Fq, Lk, H, P, 2]
  full = jnp.broadcast_to(k.astype(jnp.float32).reshape(k.shape[:-1] + (k.shape[-1] // 2, 2))[:, None],
                          new.shape[:1] + (re.shape[1],) + k.shape[1:-1] + (k.shape[-1] // 2, 2))
  full = full.at[:, :, :, :, pairs].set(new)
  return full.reshape(full.shape[:-2] + (k.shape[-1],)).astype(k.dtype)


def per_view_attention(q, k_views, v, mask, tokens_per_frame):
  """Softmax attention where each query frame ``f`` uses its own keys ``k_views[:, f]``.

  Args:
    q: ``[B, Fq * N, H, D]``; k_views: ``[B, Fq, Lk, H, D]``; v: ``[B, Lk, H, D]``;
    mask: bool broadcastable to ``[B, Fq * N, Lk]`` or None.

  Returns:
    ``[B, Fq * N, H, D]``.
  """
  import jax  # pylint: disable=g-import-not-at-top
  b, lq, h, d = q.shape
  fq = k_views.shape[1]
  qf = q.reshape(b, fq, tokens_per_frame, h, d)
  logits = jnp.einsum("bfnhd,bfkhd->bhfnk", qf, k_views, preferred_element_type=jnp.float32) * d**-0.5
  logits = logits.reshape(b, h, lq, -1)
  if mask is not None:
    logits = jnp.where(mask[:, None] if mask.ndim == 3 else mask, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v).astype(q.dtype)
