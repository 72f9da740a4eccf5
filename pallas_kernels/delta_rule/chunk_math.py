"""One chunk of the WY/UT gated delta rule, forward and hand-derived backward, for one head.

Written with block-level operations that both Pallas lowerings accept (2-D arrays, iota
masks, matmuls, reductions, loops with masked row updates; no gathers, no triangular solve).
Shapes: ``q`` (already scaled), ``k``, ``g`` (cumulative log-decay within the chunk) ``[C, K]``;
``v`` ``[C, V]``; ``beta`` ``[C, 1]``; state ``s`` ``[K, V]``. Only exponentials of non-positive
numbers are taken. Forward (docs/design.md §7):

    E_ijd = exp(G_id - G_jd)  (j <= i)
    A_ij  = beta_i sum_d k_id k_jd E_ijd  (j < i),   Aqk_ij = sum_d q_id k_jd E_ijd  (j <= i)
    W = (I + A)^-1 (beta exp(G) k),   U = (I + A)^-1 (beta v),   Vn = U - W S
    O = (q exp(G)) S + Aqk Vn,   S' = exp(G_C) S + (exp(G_C - G) k)^T Vn
"""

import jax
import jax.numpy as jnp

_f32 = jnp.float32


def _dot(a, b):
  return jnp.dot(a, b, preferred_element_type=_f32)


def _dot_tn(a, b):
  """``a.T @ b``."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=_f32)


def _dot_nt(a, b):
  """``a @ b.T``."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_f32)


def _rows(c):
  return jax.lax.broadcasted_iota(jnp.int32, (c, 1), 0)


def _take_row(x, i):
  """Row ``i`` of ``x`` as ``[1, n]`` (masked sum: no dynamic indexing)."""
  return jnp.sum(jnp.where(_rows(x.shape[0]) == i, x, 0.0), axis=0, keepdims=True)


def _row_sums(x):
  """``[1, n]`` row of the sums of ``x [n, m]``'s rows. Summing the transpose over sublanes keeps the result a
  row; ``jnp.sum(x, axis=1)[None, :]`` needs a sublane gather, which TPU v4's Mosaic lacks."""
  return jnp.sum(x.T, axis=0, keepdims=True)


def _put_row(x, i, row):
  return jnp.where(_rows(x.shape[0]) == i, row, x)


def _pair_rows(x, k, g, i):
  """``[C(j), K]`` of ``x_i * k_j * exp(G_i - G_j)`` masked to ``j <= i``, and ``exp(G_i - G_j)``."""
  c = k.shape[0]
  g_i = _take_row(g, i)
  e = jnp.exp(jnp.minimum(g_i - g, 0.0))
  keep = _rows(c) <= i
  return jnp.where(keep, _take_row(x, i) * k * e, 0.0), e


def intra_chunk(q, k, g, beta):
  """``(A [C, C] strict lower incl. beta, Aqk [C, C] lower)``."""
  c = q.shape[0]
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, c), 1)

  def body(i, carry):
    a, aqk = carry
    kk, _ = _pair_rows(k, k, g, i)
    qk, _ = _pair_rows(q, k, g, i)
    a = _put_row(a, i, jnp.where(cols < i, _row_sums(kk), 0.0) * _take_row(beta, i))
    aqk = _put_row(aqk, i, _row_sums(qk))
    return a, aqk

  zero = jnp.zeros((c, c), _f32)
  return jax.lax.fori_loop(0, c, body, (zero, zero))


def solve_lower(a, rhs):
  """``(I + a)^-1 rhs`` for strictly lower ``a`` (forward substitution, one row per step)."""
  def body(i, x):
    return _put_row(x, i, _take_row(rhs, i) - _dot(_take_row(a, i), x))
  return jax.lax.fori_loop(0, a.shape[0], body, jnp.zeros(rhs.shape, _f32))


def solve_upper_t(a, rhs):
  """``(I + a)^-T rhs`` for strictly lower ``a`` (back substitution)."""
  c = a.shape[0]
  a_t = a.T

  def body(step, x):
    i = c - 1 - step
    return _put_row(x, i, _take_row(rhs, i) - _dot(_take_row(a_t, i), x))
  return jax.lax.fori_loop(0, c, body, jnp.zeros(rhs.shape, _f32))


def chunk_forward(s, q, k, v, g, beta):
  """``(o [C, V], s_next [K, V], (a, aqk, w, u, vn))``."""
  a, aqk = intra_chunk(q, k, g, beta)
  eg = jnp.exp(g)
  w = solve_lower(a, beta * eg * k)
  u = solve_lower(a, beta * v)
  vn = u - _dot(w, s)
  o = _dot(q * eg, s) + _dot(aqk, vn)
  g_last = _take_row(g, g.shape[0] - 1)  # [1, K]
  kt = jnp.exp(g_last - g) * k
  s_next = s * jnp.exp(g_last).T + _dot_tn(kt, vn)
  return o, s_next, (a, aqk, w, u, vn)


def _pair_backward(dp, x, k, g):
  """Gradients of ``P_ij = sum_d x_id k_jd exp(G_id - G_jd)`` (``dp`` already masked) w.r.t. x, k, G."""
  c = x.shape[0]

  def body(i, carry):
    dx, dk, dg = carry
    t, e = _pair_rows(x, k, g, i)  # x_i k_j e_ij, masked j <= i
    dp_i = _take_row(dp, i).T  # [C(j), 1]
    dx = _put_row(dx, i, jnp.sum(dp_i * jnp.where(_rows(c) <= i, k * e, 0.0), axis=0, keepdims=True))
    dk = dk + dp_i * jnp.where(_rows(c) <= i, _take_row(x, i) * e, 0.0)
    tt = dp_i * t
    dg = _put_row(dg, i, _take_row(dg, i) + jnp.sum(tt, axis=0, keepdims=True)) - tt
    return dx, dk, dg

  zero = jnp.zeros(x.shape, _f32)
  return jax.lax.fori_loop(0, c, body, (zero, zero, zero))


def chunk_backward(s, q, k, v, g, beta, do, ds_next):
  """Gradients of :func:`chunk_forward`'s ``(o, s_next)`` given ``do [C, V]`` and ``ds_next [K, V]``.

  Returns ``(ds, dq, dk, dv, dg, dbeta)`` with ``dg`` w.r.t. the cumulative ``g``.
  """
  c = q.shape[0]
  _, _, (a, aqk, w, u, vn) = chunk_forward(s, q, k, v, g, beta)
  eg = jnp.exp(g)
  g_last = _take_row(g, c - 1)
  kt = jnp.exp(g_last - g) * k
  rows = _rows(c)
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, c), 1)

  dvn = _dot_tn(aqk, do) + _dot(kt, ds_next)
  ds = _dot_tn(q * eg, do) + ds_next * jnp.exp(g_last).T - _dot_tn(w, dvn)
  dos = _dot_nt(do, s)  # [C, K]
  dq = dos * eg
  dg = dos * q * eg
  daqk = jnp.where(cols <= rows, _dot_nt(do, vn), 0.0)
  dkt = _dot_nt(vn, ds_next)  # [C, K]
  dk = dkt * jnp.exp(g_last - g)
  dg = dg - dkt * kt
  dg_last = jnp.sum(dkt * kt, axis=0, keepdims=True) + _row_sums(ds_next * s) * jnp.exp(g_last)
  dw = -_dot_nt(dvn, s)
  drw = solve_upper_t(a, dw)
  dru = solve_upper_t(a, dvn)
  da = jnp.where(cols < rows, -(_dot_nt(drw, w) + _dot_nt(dru, u)), 0.0)
  dbeta = jnp.sum(drw * eg * k, axis=1, keepdims=True) + jnp.sum(dru * v, axis=1, keepdims=True)
  dk = dk + drw * beta * eg
  dg = dg + drw * beta * eg * k
  dv = dru * beta
  # A = beta_i M_ij: dbeta_i += sum_j dA_ij M_ij; dM = beta_i dA.
  m, _ = intra_chunk(k, k, g, jnp.ones_like(beta))
  dbeta = dbeta + jnp.sum(da * m, axis=1, keepdims=True)
  dx1, dk1, dg1 = _pair_backward(da * beta, k, k, g)
  dq2, dk2, dg2 = _pair_backward(daqk, q, k, g)
  dk = dk + dx1 + dk1 + dk2
  dq = dq + dq2
  dg = dg + dg1 + dg2
  dg = dg + jnp.where(rows == c - 1, dg_last, 0.0)
  return ds, dq, dk, dv, dg, dbeta
