"""Gated delta rule (KDA / Gated DeltaNet; LOCI §3-4; docs/design.md §7), pure ``jnp``.

Per head, state ``S [K, V]`` (float32); per token ``t``:

    S <- diag(exp(g_t)) S                      (decay first)
    S <- S + beta_t k_t (v_t - S^T k_t)^T      (delta correction second)
    o_t = S^T (scale * q_t)                    (read after the write)

exactly fla's ``naive_recurrent_kda`` (``g [B, T, H, K]``, per channel) and
``naive_recurrent_gated_delta_rule`` (``g [B, T, H]``, per head). Layout ``[B, T, H, K]``;
nothing is normalised here. Scans take ``initial_state [B, H, K, V]`` and return
``(o, final_state)`` with ``final_state`` None unless ``output_final_state``.

- :func:`delta_rule_recurrent`: the token-by-token scan (the reference).
- :func:`delta_rule_chunked`: the WY/UT chunked form (one chunk of ``C`` tokens per scan
  step; only exponentials of non-positive cumulative differences are ever taken).
- :func:`delta_rule_chunk_before_write`: LOCI's read-before-write chunks.
- :func:`delta_rule_write`: the state after writes alone (no decay, no read): LOCI's chunk write, at the cost of
  the chunked form's state terms only.

The argument checks and input preparation (``check_inputs``, ``prepare_inputs``, ``pad_time``) are the op's
interface, :mod:`jaxwm.interfaces.delta_rule`, shared with the kernels (re-exported here). References only: the
Pallas kernels and ``impl=`` live in ``jaxwm.kernels``.
"""

import functools

import jax
import jax.numpy as jnp

from jaxwm.interfaces.delta_rule import check_inputs, pad_time, prepare_inputs  # noqa: F401  (re-exported)

_f32 = jnp.float32


def delta_rule_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
  """The token-by-token gated delta rule.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    g: log-decay ``[B, T, H, K]`` (KDA) or ``[B, T, H]`` (Gated DeltaNet), ``<= 0``.
    beta: write strength ``[B, T, H]`` (LOCI: in ``(0, 2)``).
    scale: query scale, default ``K ** -0.5``.
    initial_state: ``[B, H, K, V]`` or None (zeros).
    output_final_state: return the state after the last token.

  Returns:
    ``(o [B, T, H, V] in v's dtype, final_state [B, H, K, V] float32 or None)``.
  """
  dtype = v.dtype
  q, k, v, g, beta, s0 = prepare_inputs(q, k, v, g, beta, scale, initial_state)

  def step(s, xs):
    q_t, k_t, v_t, g_t, b_t = xs  # [B, H, ...]
    s = s * jnp.exp(g_t)[..., None]
    err = v_t - jnp.einsum("bhk,bhkv->bhv", k_t, s)
    s = s + jnp.einsum("bhk,bhv->bhkv", b_t[..., None] * k_t, err)
    return s, jnp.einsum("bhk,bhkv->bhv", q_t, s)

  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
  s, o = jax.lax.scan(step, s0, xs)
  return jnp.moveaxis(o, 0, 1).astype(dtype), (s if output_final_state else None)


def _decayed_products(x, k, gcum, sub):
  """``P[..., i, j] = sum_d x_id k_jd exp(G_id - G_jd)`` for ``j <= i`` (0 above), chunk ``[..., C, K]``.

  Within sub-chunks of ``sub`` tokens the decay is formed pairwise. Across sub-chunks (query sub-chunk ``I``
  after key sub-chunk ``J``) it is factorised at ``p``, the end of sub-chunk ``I - 1``, and ``r``, the end of
  ``J``: ``exp(G_i - G_p) exp(G_p - G_r) exp(G_r - G_j)``, each factor ``<= 1`` -- so no exponential of a
  positive cumulative difference is ever taken, and only ``C / sub`` squared middle factors per channel.
  (The three-operand einsums are deliberate: jaxlib 0.10.2's YNNPACK fusions crash in the backward pass of the
  equivalent broadcast-multiply forms.)
  """
  c, dk = x.shape[-2:]
  n = c // sub
  lead = x.shape[:-2]
  xs, ks, gs = (a.reshape(lead + (n, sub, dk)) for a in (x, k, gcum))
  tri = jnp.tril(jnp.ones((sub, sub), bool))
  diff = jnp.where(tri[:, :, None], gs[..., :, None, :] - gs[..., None, :, :], -jnp.inf)  # [..., n, s, s, K]
  diag = jnp.einsum("...nik,...nijk,...njk->...nij", xs, jnp.exp(diff), ks)
  if n == 1:
    return diag.reshape(lead + (c, c))
  end = gs[..., -1, :]  # [..., n, K] cumulative decay at the end of each sub-chunk
  prev = jnp.pad(end[..., :-1, :], [(0, 0)] * (end.ndim - 2) + [(1, 0), (0, 0)])  # end of sub-chunk I - 1
  q_p = xs * jnp.exp(jnp.minimum(gs - prev[..., :, None, :], 0.0))  # queries decayed back to p
  k_r = ks * jnp.exp(end[..., :, None, :] - gs)  # keys decayed to their sub-chunk's end r
  mid = jnp.exp(jnp.minimum(prev[..., :, None, :] - end[..., None, :, :], 0.0))  # [..., I, J, K]: p after r
  off = jnp.einsum("...Iik,...IJk,...Jjk->...IiJj", q_p, mid, k_r)
  later = jnp.tril(jnp.ones((n, n), bool), -1)  # query sub-chunk I after key sub-chunk J
  off = jnp.where(later[:, None, :, None], off, 0.0)
  eye = jnp.eye(n, dtype=bool)[:, None, :, None]
  full = off + jnp.where(eye, diag[..., :, :, None, :], 0.0)  # [..., I, i, J, j]
  return full.reshape(lead + (c, c))


def _unit_lower_inverse(a):
  """``(I + A)^-1`` for strictly lower-triangular (so nilpotent) ``A [..., C, C]``:
  ``(I - A)(I + A^2)(I + A^4)...`` -- ``log2 C`` matmuls, exact once ``A^(2^m) = 0`` (``2^m >= C``).
  Matmuls only (XLA:CPU's triangular-solve custom call has hung on repeated backward passes)."""
  c = a.shape[-1]
  eye = jnp.eye(c, dtype=a.dtype)
  inv, power, n = eye - a, a, 2
  while n < c:
    power = power @ power
    inv = inv @ (eye + power)
    n *= 2
  return inv


def _intra_chunk(q, k, v, gcum, beta, sub):
  """Everything of the WY/UT form that does not depend on the incoming state, for all chunks at
  once (``[..., C, ...]``): ``(w, u, a_qk, q exp(G), exp(G_C - G) k, exp(G_C))``."""
  c = q.shape[-2]
  p_kk = _decayed_products(k, k, gcum, sub)
  a_kk = jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), p_kk, 0.0) * beta[..., None]
  a_qk = _decayed_products(q, k, gcum, sub)
  # T = (I + A)^-1: w = T (beta exp(G) k), u = T (beta v).
  t_inv = _unit_lower_inverse(a_kk)
  w = t_inv @ (beta[..., None] * jnp.exp(gcum) * k)
  u = t_inv @ (beta[..., None] * v)
  last = gcum[..., -1:, :]
  return w, u, a_qk, q * jnp.exp(gcum), jnp.exp(last - gcum) * k, jnp.exp(last[..., 0, :])


def _state_step(s, xs):
  """One chunk of the state recurrence: ``v_new = u - w S``, ``o = (q exp(G)) S + Aqk v_new``,
  ``S <- exp(G_C) S + (exp(G_C - G) k)^T v_new``."""
  w, u, a_qk, qg, kt, decay = xs
  v_new = u - jnp.einsum("bhck,bhkv->bhcv", w, s)
  o = jnp.einsum("bhck,bhkv->bhcv", qg, s) + jnp.einsum("bhij,bhjv->bhiv", a_qk, v_new)
  s = s * decay[..., None] + jnp.einsum("bhck,bhcv->bhkv", kt, v_new)
  return s, o


def sub_chunk(chunk_size):
  """The sub-chunk of :func:`_decayed_products` for a chunk: about ``(2 C)^(1/3)`` tokens, which balances the
  pairwise decays inside sub-chunks (``C sub K``) against the factors across them (``(C / sub)^2 K``): 4 up to
  ``C = 32``, 8 beyond (fastest on CPU, ``benchmarks/delta_rule.py``)."""
  for s in ((4, 2, 1) if chunk_size <= 32 else (8, 4, 2, 1)):
    if chunk_size % s == 0:
      return s
  return 1


def _chunks(x, chunk_size):
  """``[B, T, H, ...]`` with ``T`` a multiple of ``chunk_size`` -> ``[N, B, H, C, ...]`` (scan over N)."""
  b, t, h = x.shape[:3]
  x = x.reshape((b, t // chunk_size, chunk_size, h) + x.shape[3:])
  return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)


def _chunked_scan(q, k, v, g, beta, s0, chunk_size):
  """Chunked scan over prepared float32 inputs; returns ``(o [B, T, H, V], final state)``."""
  b, t, h, dk = q.shape
  pad = (-t) % chunk_size
  # Padded tokens: beta = 0 writes nothing and g = 0 decays nothing, so the state is exact.
  q, k, v, g, beta = (pad_time(x, pad) for x in (q, k, v, g, beta))
  n = (t + pad) // chunk_size
  chunks = functools.partial(_chunks, chunk_size=chunk_size)
  gcum = jnp.cumsum(chunks(g), axis=3)
  # recomputed in the backward pass
  intra = jax.checkpoint(functools.partial(_intra_chunk, sub=sub_chunk(chunk_size)))
  xs = intra(chunks(q), chunks(k), chunks(v), gcum, chunks(beta))
  s, o = jax.lax.scan(_state_step, s0, xs)
  o = jnp.moveaxis(o, 0, 1)  # [B, N, H, C, V]
  o = jnp.moveaxis(o, 2, 3).reshape(b, n * chunk_size, h, -1)
  return o[:, :t], s


def delta_rule_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                       chunk_size=64):
  """The chunked (WY/UT) form of :func:`delta_rule_recurrent`, same arguments and results.

  ``T`` need not be a multiple of ``chunk_size`` (padded with ``beta = 0``, ``g = 0``).
  """
  dtype = v.dtype
  q, k, v, g, beta, s0 = prepare_inputs(q, k, v, g, beta, scale, initial_state)
  o, s = _chunked_scan(q, k, v, g, beta, s0, chunk_size)
  return o.astype(dtype), (s if output_final_state else None)


def _write_terms(k, v, beta):
  """The WY/UT terms of writes without decay, for all chunks at once (``[..., C, ...]``): ``(w, u)`` with
  ``T = (I + tril(beta k k^T, -1))^-1``, ``w = T (beta k)``, ``u = T (beta v)``."""
  c = k.shape[-2]
  a = jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), k @ jnp.swapaxes(k, -1, -2), 0.0) * beta[..., None]
  t_inv = _unit_lower_inverse(a)
  return t_inv @ (beta[..., None] * k), t_inv @ (beta[..., None] * v)


def _write_step(s, xs):
  """One chunk of writes: ``S <- S + k^T (u - w S)``."""
  w, u, k = xs
  return s + jnp.einsum("bhck,bhcv->bhkv", k, u - jnp.einsum("bhck,bhkv->bhcv", w, s)), None


def delta_rule_write(k, v, beta, *, initial_state=None, chunk_size=64):
  """The state after writing the tokens in order, with no decay and no read:
  ``S <- S + beta_t k_t (v_t - S^T k_t)^T`` (LOCI's chunk write, docs/design.md §7).

  Equal to ``delta_rule_chunked(0, k, v, 0, beta, ..., output_final_state=True)[1]`` (:func:`delta_rule_recurrent`
  with ``q = 0``, ``g = 0``), without the terms that zero queries and zero decays would compute: no pairwise
  decays, no query products, no outputs.

  Args:
    k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; beta: ``[B, T, H]``.
    initial_state: ``[B, H, K, V]`` or None (zeros).
    chunk_size: tokens per scan step (``T`` is padded with ``beta = 0``, which writes nothing).

  Returns:
    ``final_state [B, H, K, V]`` float32.
  """
  no_decay = jax.ShapeDtypeStruct(k.shape[:3], _f32)  # shapes only: no queries (k stands in), no decays
  check_inputs(k, k, v, no_decay, beta, initial_state)
  b, _, h, dk = k.shape
  s0 = jnp.zeros((b, h, dk, v.shape[-1]), _f32) if initial_state is None else initial_state.astype(_f32)
  pad = (-k.shape[1]) % chunk_size
  kc, vc, bc = (_chunks(pad_time(x.astype(_f32), pad), chunk_size) for x in (k, v, beta))
  w, u = jax.checkpoint(_write_terms)(kc, vc, bc)  # recomputed in the backward pass
  s, _ = jax.lax.scan(_write_step, s0, (w, u, kc))
  return s


def delta_rule_chunk_before_write(q, k, v, g, beta, *, chunk_len, scale=None, initial_state=None,
                                  output_final_state=False, inner_chunk_size=64):
  """LOCI's memory read (docs/design.md §7): chunks of ``chunk_len`` tokens read the state from
  before the chunk, then write it token by token.

  For chunk ``c`` (tokens ``c L .. c L + L - 1``):
  ``o_t = S_{c-1}^T (scale q_t)``; then ``S <- diag(exp(g_{cL})) S_{c-1}`` (the decay of the
  chunk's *first* token, once; ``g`` of the other tokens is not used) and the delta
  corrections of the chunk's tokens in order, without further decay.

  Args: as :func:`delta_rule_recurrent`, ``T`` a multiple of ``chunk_len``.

  Returns:
    ``(o [B, T, H, V], final_state or None)``.
  """
  dtype = v.dtype
  q, k, v, g, beta, s0 = prepare_inputs(q, k, v, g, beta, scale, initial_state)
  b, t, h, dk = q.shape
  if t % chunk_len:
    raise ValueError(f"T={t} must be a multiple of chunk_len={chunk_len}")
  n = t // chunk_len
  split = lambda x: jnp.moveaxis(x.reshape((b, n, chunk_len) + x.shape[2:]), 1, 0)
  inner = min(inner_chunk_size, chunk_len)

  def body(s, xs):
    q_c, k_c, v_c, g_c, b_c = xs  # [B, L, H, ...]
    o = jnp.einsum("bthk,bhkv->bthv", q_c, s)
    s = s * jnp.exp(g_c[:, 0])[..., None]
    _, s = _chunked_scan(jnp.zeros_like(q_c), k_c, v_c, jnp.zeros_like(g_c), b_c, s, inner)
    return s, o

  s, o = jax.lax.scan(body, s0, tuple(split(x) for x in (q, k, v, g, beta)))
  o = jnp.moveaxis(o, 0, 1).reshape(b, t, h, -1)
  return o.astype(dtype), (s if output_final_state else None)
