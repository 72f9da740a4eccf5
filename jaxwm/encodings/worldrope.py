"""WorldRoPE's expected rotary factor (WorldRoPE §3; the paper's equations are missing from
its text, so this follows the project's reading in docs/design.md §4).

A key token carries ``M`` depth hypotheses (weights ``alpha``, depths ``mu``, spreads
``sigma``). Each is a world-space Gaussian: centre ``X = o + mu R K^-1 [u, v, 1]`` and covariance
``J diag(s^2, s^2, sigma^2) J^T`` with ``J = dX / d(u, v, depth)`` and ``s^2 = p^2 / 12`` (a
uniform patch of ``p`` pixels). Projected into a query view to first order (mean ``mu'``,
covariance ``Sigma' = J_pi Sigma J_pi^T``; a hypothesis behind the query camera gets weight 0),
a rotary frequency ``w`` (a 2-vector in token-grid units) has the expected factor

    E[exp(i w . u)] = sum_m alpha_m exp(i w . mu'_m - w^T Sigma'_m w / 2),

one complex number per channel pair: a rotation scaled by an attenuation. With every
covariance -> 0 and ``M = 1`` it is the ordinary rotation at the projected point.

In attention (:class:`WorldRoPE`, called by ``jaxwm.models.attention``) keys keep only the temporal RoPE; a
linear head on each key token's input gives its hypotheses; for every query frame the keys'
h/w pairs are multiplied by their expected factor in that view (``jaxwm.ops.view_factors``; ``cpu_flash``: a C++
kernel, ``jaxwm.kernels.view_factors``) and
each query frame attends with its own keys (``jaxwm.kernels.per_view_attention``: ``cpu_flash`` rotates the keys
inside its kernel). The KV cache keeps the pre-transform keys and each key's Gaussians.
"""

import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm import kernels
from jaxwm.encodings.base import CameraEncoding, ChannelPlan, per_token
from jaxwm.encodings.rope3d import apply_rotary, rope_axis_dims, rope_frequencies
from jaxwm.geometry.cameras import token_pixel_centers
from jaxwm.layers import batch_mesh_axes
from jaxwm.ops.attention import pair_channels, per_view_logits, rotate_pairs


def unproject_gaussians(uv, mu, sigma, intrinsics, c2w, patch_pixels):
  """World Gaussians of depth hypotheses, their covariances as square roots.

  Args:
    uv: ``[..., 2]`` pixel centres of the key tokens.
    mu, sigma: ``[..., M]`` depths (z-depth, >= 0) and their standard deviations.
    intrinsics: ``[..., 3, 3]``; c2w: ``[..., 4, 4]`` of the key's camera.
    patch_pixels: ``p``, the token's footprint in pixels (position variance ``p^2 / 12``).

  Returns:
    ``(mean [..., M, 3], root [..., M, 3, 3])`` with covariance ``root @ root^T =
    J diag(s^2, s^2, sigma^2) J^T`` (``root = J diag(s, s, sigma)``: positive semi-definite by construction).
  """
  k_inv = jnp.linalg.inv(intrinsics)
  rot, origin = c2w[..., :3, :3], c2w[..., :3, 3]
  ray = jnp.einsum("...ij,...j->...i", rot @ k_inv, jnp.concatenate([uv, jnp.ones_like(uv[..., :1])], -1))
  du = (rot @ k_inv)[..., :, 0]  # dX/du per unit depth
  dv = (rot @ k_inv)[..., :, 1]
  mean = origin[..., None, :] + mu[..., None] * ray[..., None, :]
  s = patch_pixels / np.sqrt(12.0)
  root = jnp.stack([(s * mu)[..., None] * du[..., None, :], (s * mu)[..., None] * dv[..., None, :],
                    sigma[..., None] * ray[..., None, :]], -1)  # [..., M, 3, 3] columns u, v, depth
  return mean, root


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
    dict with ``mean [B, L, M, 3]``, ``root [B, L, M, 3, 3]`` (covariance roots), ``alpha [B, L, M]``.
  """
  m = depth_init.shape[0]
  logits, d, log_s = raw[..., :m], raw[..., m:2 * m], raw[..., 2 * m:]
  mu = jnp.maximum(d + depth_init, 0.0)
  sigma = jnp.exp(log_s - 1.0)
  mean, root = unproject_gaussians(jnp.broadcast_to(uv, raw.shape[:2] + (2,)), mu, sigma, intrinsics, c2w,
                                   patch_pixels)
  return {"mean": mean, "root": root, "alpha": jax.nn.softmax(logits, axis=-1)}


def transform_keys(k, gauss, q_intrinsics, q_c2w, freqs, pair_idx, pixels_per_token, per_view=False, impl="xla"):
  """The pairs ``pair_idx`` of every key as seen from each query view: ``k [B, Lk, H, D]`` ->
  ``[B, Fq, Lk, H, 2 P]`` (channels ``2p, 2p + 1`` of each pair, in ``pair_idx`` order).

  Each pair is multiplied (as a complex number) by the expected rotary factor of the key's Gaussians
  projected into query view ``f`` (``jaxwm.kernels.view_factors`` by ``impl``, ``per_view`` for the reference;
  ``jaxwm.ops.attention.rotate_pairs``). The other channels do not depend on the view and are not repeated per view
  (the per-view attention takes them from ``k``).
  """
  factors = kernels.view_factors(gauss, q_intrinsics, q_c2w, freqs, pixels_per_token, impl=impl, per_view=per_view,
                                 batch_axes=batch_mesh_axes())
  return rotate_pairs(k, factors, pair_idx)


def per_view_attention_cached(q, cache, own, mask, channels):
  """Per-view attention (``jaxwm.ops.attention.per_view_attention``) over ``[cache; own]`` keys without
  concatenating them (the sampler's forwards), with the keys' views given (:func:`transform_keys`).

  Args:
    q: ``[B, Fq * N, H, D]`` (RoPE applied).
    cache, own: ``(k [B, L, H, D], k_views [B, Fq, L, H, C], v [B, L, H, D])`` each, ``L = Lc`` and ``Lo``; the
      ``C = len(channels)`` view-dependent channels of ``k`` are read from ``k_views``.
    mask: bool broadcastable to ``[B, Fq * N, Lc + Lo]`` (or ``[B, H, Fq * N, Lc + Lo]``), or None.

  The softmax over both blocks is taken with one shared maximum ``m = max(max_c, max_o)``:

      out = (exp(l_c - m) v_c + exp(l_o - m) v_o) / (sum exp(l_c - m) + sum exp(l_o - m)),

  which is the per-view attention on the concatenated keys, exactly in real arithmetic (the tests compare the
  two, values and gradients); a forward copies no cached key into a concatenation (on CPU that copy, with its
  layout change, was a tenth of the sampler's forward). Returns ``[B, Fq * N, H, D]`` in ``q``'s dtype.
  """
  d = q.shape[-1]
  rest = np.setdiff1d(np.arange(d), channels)
  q_ch, q_rest = q[..., channels], q[..., rest]
  lc = cache[0].shape[1]
  masks = (None, None) if mask is None else (mask[..., :lc], mask[..., lc:])
  logits = []
  for (k, k_views, _), m in zip((cache, own), masks):
    l = per_view_logits(q_ch, k_views, q_rest, k[..., rest], scale=d**-0.5)  # [B, H, Fq * N, L]
    if m is not None:
      m = jnp.asarray(m)
      l = jnp.where(m[:, None] if m.ndim == 3 else m, l, -jnp.inf)
    logits.append(l)
  top = jax.lax.stop_gradient(jnp.maximum(*(jnp.max(l, -1, keepdims=True) for l in logits)))
  probs = [jnp.exp(l - top) for l in logits]
  out = sum(jnp.einsum("bhqk,bkhd->bqhd", p, kv[2].astype(jnp.float32)) for p, kv in zip(probs, (cache, own)))
  total = sum(jnp.sum(p, -1) for p in probs)  # [B, H, Lq]
  return (out / jnp.swapaxes(total, 1, 2)[..., None]).astype(q.dtype)


@flax.struct.dataclass
class WorldRopeTensors:
  """Key tokens' pixel centres ``uv [S*N, 2]``, cameras ``key_c2w [B, S*N, 4, 4]``, ``key_k [B, S*N, 3, 3]``;
  the query frames' ``q_c2w [B, S, 4, 4]`` and ``q_k [B, S, 3, 3]``."""
  uv: jax.Array
  key_c2w: jax.Array
  key_k: jax.Array
  q_c2w: jax.Array
  q_k: jax.Array


class WorldRoPE(CameraEncoding):
  """WorldRoPE: keys carry depth Gaussians and are rotated per query view by the expected factor."""
  name = "worldrope"
  unit = 2
  per_view_keys = True
  _GAUSS = ("mean", "root", "alpha")

  def check(self, cfg):
    from jaxwm.encodings.channels import channel_index, resolve_channels  # pylint: disable=g-import-not-at-top
    t = rope_axis_dims(cfg.head_dim)[0]
    ranges, _ = resolve_channels(cfg.camera.channels, cfg.head_dim, self.name, self.unit)
    if min(channel_index(ranges)) < t or any(s % 2 for s, _ in ranges):
      raise ValueError(f"model.camera.channels {list(ranges)} for 'worldrope' must be whole h/w RoPE pairs "
                       f"(channels >= {t}); use 'hw'")

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    n = grid_hw[0] * grid_hw[1]
    uv = token_pixel_centers(grid_hw, patch_hw, (cam_cfg.vae_stride,) * 2, xp=jnp).reshape(n, 2)
    k = intrinsics.astype(jnp.float32)
    return WorldRopeTensors(jnp.tile(uv, (c2w.shape[1], 1)), per_token(c2w, n), per_token(k, n), c2w, k)

  def cache_entries(self, cfg):
    m = cfg.camera.hypotheses
    return {"wr_mean": ((m, 3), jnp.float32), "wr_root": ((m, 3, 3), jnp.float32), "wr_alpha": ((m,), jnp.float32)}

  def _pairs(self, cfg):
    """The RoPE pairs the keys' views change (static) and their 2-D frequencies."""
    pairs = sorted({c // 2 for c in ChannelPlan(cfg.camera, cfg.head_dim).idx})
    return pairs, hw_frequencies(cfg.head_dim, pairs, cfg.rope_theta, cfg.camera.mixed_frequencies)

  def cache_views(self, cfg, cache_keys, c2w, intrinsics):
    """:func:`transform_keys` of every softmax layer's cached keys for the query frames: ``{"wr_views":
    [L_softmax, B, Fq, L_cache, H, C]}``. The views' pairs carry no RoPE (``attend`` rotates only the other
    pairs), so they need only the raw keys, their Gaussians and the query cameras."""
    pairs, freqs = self._pairs(cfg)
    pixels = cfg.patch_size[1] * cfg.camera.vae_stride
    q_k = intrinsics.astype(jnp.float32)

    impl = kernels.resolve_view_factors_impl(cfg.attention_impl)

    def layer(k, mean, root, alpha):
      gauss = {"mean": mean, "root": root, "alpha": alpha}
      return transform_keys(k.astype(cfg.compute_dtype), gauss, q_k, c2w, freqs, pairs, pixels, per_view=True,
                            impl=impl)

    # every layer at once (a loop over layers wrote its stacked output 2x slower on CPU)
    return {"wr_views": jax.vmap(layer)(*(cache_keys[n] for n in ("k", "wr_mean", "wr_root", "wr_alpha")))}

  def attend(self, cfg, x, q, k, v, queries, cached, cache_kv, mask, plan):
    """Per-view attention of queries ``q [B, L, H, D]`` (raw) over own keys ``k, v`` and the cache.

    ``queries`` / ``cached``: :class:`jaxwm.encodings.base.Encoded` of the query frames and cached
    frames; ``cache_kv``: the cached raw keys, values and Gaussians (or None); ``mask``: token
    mask ``[B, (H,) Lq, Lk]`` or None. Called inside the attention layer's scope (creates its depth
    head). Returns ``(out [B, L, H, D], own per-key entries)``.
    """
    cc, cam = cfg.camera, queries.cam
    keep = jnp.asarray(~plan.pair_mask, jnp.float32)
    q = apply_rotary(q, queries.rope)
    m = cc.hypotheses
    raw = nn.Dense(3 * m, name="depth_head", kernel_init=nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ("embed", None)), bias_init=nn.with_logical_partitioning(
            nn.initializers.zeros_init(), (None,)))(x.astype(jnp.float32))
    pixels = cfg.patch_size[1] * cc.vae_stride
    gauss = key_gaussians(raw, cam.uv, cam.key_k, cam.key_c2w, pixels,
                          jnp.linspace(cc.depth_range[0], cc.depth_range[1], m))
    own = {"k": k, "v": v, **{f"wr_{name}": gauss[name] for name in self._GAUSS}}
    keys = dict(own, k=apply_rotary(k, queries.rope * keep))  # keys: time RoPE only, at their positions
    pairs, freqs = self._pairs(cfg)
    factor_impl = kernels.resolve_view_factors_impl(cfg.attention_impl)
    gauss_of = lambda ks: {n: ks[f"wr_{n}"] for n in self._GAUSS}  # pylint: disable=unnecessary-lambda-assignment
    hoisted = None if cache_kv is None else cache_kv.get("wr_views")  # the cache's views, from cache_views
    channels = pair_channels(pairs)
    if hoisted is not None:  # the sampler (cache_views): the cache's blocks apart from the own chunk's
      old_k = apply_rotary(cache_kv["k"].astype(k.dtype), cached.rope * keep)
      out = per_view_attention_cached(q, (old_k, hoisted.astype(k.dtype), cache_kv["v"].astype(v.dtype)),
                                      (keys["k"], transform_keys(keys["k"], gauss_of(keys), cam.q_k, cam.q_c2w, freqs,
                                                                 pairs, pixels, per_view=True, impl=factor_impl), v),
                                      mask, channels)
      return out, own
    if cache_kv is not None:
      old = {name: cache_kv[name] for name in keys}
      old["k"] = apply_rotary(cache_kv["k"].astype(k.dtype), cached.rope * keep)
      keys = {name: jnp.concatenate([old[name].astype(a.dtype), a], axis=1) for name, a in keys.items()}
    with jax.named_scope("worldrope_factors"):  # named in profiles (benchmarks/profile_step.py)
      factors_of = functools.partial(kernels.view_factors, freqs=freqs, pixels_per_token=pixels, impl=factor_impl,
                                     batch_axes=batch_mesh_axes())
      if factor_impl == "xla":  # rematerialised: XLA's backward kept five per-hypothesis residuals (the kernel: none)
        factors_of = jax.checkpoint(factors_of)
      factors = factors_of(gauss_of(keys), cam.q_k, cam.q_c2w)
    out = kernels.per_view_attention(q, keys["k"], keys["v"], factors, pairs, mask, scale=q.shape[-1] ** -0.5,
                                     impl=cfg.attention_impl, batch_axes=batch_mesh_axes())
    return out, own


ENCODING = WorldRoPE()
