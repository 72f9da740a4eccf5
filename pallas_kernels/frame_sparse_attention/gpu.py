"""GPU (Triton lowering) frame-sparse attention: the frame lists are an ordinary input.

Forward and ``dq``: one program per ``(batch, head, query frame, query block)`` loops over the
slots of its frame list and, for each selected frame, over its key blocks (a slot of -1 runs
zero iterations), with online softmax in registers. ``dk``/``dv``: one program per ``(batch,
head, query frame * slot, key block)`` loops over the query blocks of the frame; the sum over
query frames that selected the same key frame is ``common.accumulate_keys``.
Block sizes must be powers of two on a real GPU (Triton); ``interpret=True`` runs on CPU.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.frame_sparse_attention import common

# Triton lowering whatever jax's default Pallas GPU backend is (Mosaic GPU since jax 0.7).
_TRITON = pltriton.CompilerParams(num_warps=4, num_stages=2)

_f32 = jnp.float32


def _dot_t(a, b):
  """``a @ b.T`` in float32."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_f32)


def _tdot(a, b):
  """``a.T @ b`` in float32."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=_f32)


def _logits(q, k, dims, row0, col0):
  s = _dot_t(q, k) * dims.scale
  col = col0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
  row = row0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
  return jnp.where(col < dims.n, s, common.NEG), (col < dims.n) & (row < dims.n)


def _key_blocks(idx_ref, dims, b, i, slot):
  """(first key row of the selected frame, number of key blocks to visit)."""
  frame = idx_ref[(b * dims.fq + i) * dims.slots + slot]
  return jnp.maximum(frame, 0) * dims.np_, jnp.where(frame >= 0, dims.nk, 0)


def _fwd_kernel(idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, dims):
  b, i, qb = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  q = q_ref[...]

  def slot_body(slot, carry):
    base, trips = _key_blocks(idx_ref, dims, b, i, slot)

    def block_body(kb, carry):
      m_prev, l_prev, acc = carry
      start = pl.multiple_of(base + kb * dims.block_k, dims.block_k)
      s, _ = _logits(q, k_ref[pl.ds(start, dims.block_k), :], dims, qb * dims.block_q, kb * dims.block_k)
      m_new = jnp.maximum(m_prev, s.max(axis=1))
      alpha = jnp.exp(m_prev - m_new)
      p = jnp.exp(s - m_new[:, None])
      v = v_ref[pl.ds(start, dims.block_k), :]
      acc = alpha[:, None] * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=_f32)
      return m_new, alpha * l_prev + p.sum(axis=1), acc

    return jax.lax.fori_loop(0, trips, block_body, carry)

  init = (jnp.full((dims.block_q,), -jnp.inf, _f32), jnp.zeros((dims.block_q,), _f32),
          jnp.zeros((dims.block_q, q.shape[-1]), _f32))
  m, l, acc = jax.lax.fori_loop(0, dims.slots, slot_body, init)
  o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log(l)


def _dq_kernel(idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, dims):
  b, i, qb = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

  def slot_body(slot, acc):
    base, trips = _key_blocks(idx_ref, dims, b, i, slot)

    def block_body(kb, acc):
      start = pl.multiple_of(base + kb * dims.block_k, dims.block_k)
      k = k_ref[pl.ds(start, dims.block_k), :]
      s, ok = _logits(q, k, dims, qb * dims.block_q, kb * dims.block_k)
      p = jnp.where(ok, jnp.exp(s - lse[:, None]), 0.0)
      ds = p * (_dot_t(do, v_ref[pl.ds(start, dims.block_k), :]) - delta[:, None])
      return acc + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=_f32) * dims.scale

    return jax.lax.fori_loop(0, trips, block_body, acc)

  dq_ref[...] = jax.lax.fori_loop(0, dims.slots, slot_body, jnp.zeros(q.shape, _f32))


def _dkv_kernel(idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, dims):
  b, gslot, kb = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  i, slot = gslot // dims.slots, gslot % dims.slots
  base, _ = _key_blocks(idx_ref, dims, b, i, slot)
  valid = idx_ref[(b * dims.fq + i) * dims.slots + slot] >= 0
  start = pl.multiple_of(base + kb * dims.block_k, dims.block_k)
  k, v = k_ref[pl.ds(start, dims.block_k), :], v_ref[pl.ds(start, dims.block_k), :]

  def q_body(qb, carry):
    dk, dv = carry
    row = pl.multiple_of(i * dims.np_ + qb * dims.block_q, dims.block_q)
    q, do = q_ref[pl.ds(row, dims.block_q), :], do_ref[pl.ds(row, dims.block_q), :]
    s, ok = _logits(q, k, dims, qb * dims.block_q, kb * dims.block_k)
    p = jnp.where(ok, jnp.exp(s - lse_ref[pl.ds(row, dims.block_q)][:, None]), 0.0)
    ds = p * (_dot_t(do, v) - delta_ref[pl.ds(row, dims.block_q)][:, None])
    return dk + _tdot(ds.astype(q.dtype), q) * dims.scale, dv + _tdot(p.astype(do.dtype), do)

  zero = jnp.zeros(k.shape, _f32)
  dk, dv = jax.lax.fori_loop(0, jnp.where(valid, dims.nq, 0), q_body, (zero, zero))
  dk_ref[...] = dk
  dv_ref[...] = dv


def _flat(x):
  """``[B, H, F, Np, ...] -> [B, H, F*Np, ...]``."""
  return x.reshape(x.shape[:2] + (-1,) + x.shape[4:])


def _forward(q, k, v, idx, dims):
  b, h, _, _, d = q.shape
  lq, lk = dims.fq * dims.np_, dims.fk * dims.np_
  whole = lambda length: pl.BlockSpec((None, None, length, d), lambda b_, h_, i, qb: (b_, h_, 0, 0))
  o, lse = pl.pallas_call(
      functools.partial(_fwd_kernel, dims=dims),
      grid=(b, h, dims.fq, dims.nq),
      in_specs=[pl.BlockSpec((idx.shape[0],), lambda *_: (0,)),
                pl.BlockSpec((None, None, dims.block_q, d), lambda b_, h_, i, qb: (b_, h_, i * dims.nq + qb, 0)),
                whole(lk), whole(lk)],
      out_specs=[pl.BlockSpec((None, None, dims.block_q, d), lambda b_, h_, i, qb: (b_, h_, i * dims.nq + qb, 0)),
                 pl.BlockSpec((None, None, dims.block_q), lambda b_, h_, i, qb: (b_, h_, i * dims.nq + qb))],
      out_shape=[jax.ShapeDtypeStruct((b, h, lq, d), q.dtype), jax.ShapeDtypeStruct((b, h, lq), _f32)],
      interpret=dims.interpret, compiler_params=_TRITON, name="frame_sparse_fwd_gpu")(idx, _flat(q), _flat(k), _flat(v))
  return o.reshape(q.shape), lse.reshape(q.shape[:4] + (1,))


def _backward(q, k, v, idx, o, lse, do, dims):
  b, h, _, _, d = q.shape
  lq, lk = dims.fq * dims.np_, dims.fk * dims.np_
  delta = jnp.sum(o.astype(_f32) * do.astype(_f32), axis=-1)
  lse_f, delta_f = lse.reshape(b, h, lq), delta.reshape(b, h, lq)
  idx_spec = pl.BlockSpec((idx.shape[0],), lambda *_: (0,))
  whole = lambda length: pl.BlockSpec((None, None, length, d), lambda b_, h_, *_: (b_, h_, 0, 0))
  whole_row = pl.BlockSpec((None, None, lq), lambda b_, h_, *_: (b_, h_, 0))
  qblk = pl.BlockSpec((None, None, dims.block_q, d), lambda b_, h_, i, qb: (b_, h_, i * dims.nq + qb, 0))
  rblk = pl.BlockSpec((None, None, dims.block_q), lambda b_, h_, i, qb: (b_, h_, i * dims.nq + qb))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, dims=dims),
      grid=(b, h, dims.fq, dims.nq),
      in_specs=[idx_spec, qblk, whole(lk), whole(lk), qblk, rblk, rblk],
      out_specs=qblk,
      out_shape=jax.ShapeDtypeStruct((b, h, lq, d), _f32),
      interpret=dims.interpret, compiler_params=_TRITON, name="frame_sparse_dq_gpu")(idx, _flat(q), _flat(k), _flat(v), _flat(do), lse_f,
                                                            delta_f)
  part_rows = dims.fq * dims.slots * dims.np_
  kblk = pl.BlockSpec((None, None, dims.block_k, d), lambda b_, h_, g, kb: (b_, h_, g * dims.nk + kb, 0))
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, dims=dims),
      grid=(b, h, dims.fq * dims.slots, dims.nk),
      in_specs=[idx_spec, whole(lq), whole(lk), whole(lk), whole(lq), whole_row, whole_row],
      out_specs=[kblk, kblk],
      out_shape=[jax.ShapeDtypeStruct((b, h, part_rows, d), _f32)] * 2,
      interpret=dims.interpret, compiler_params=_TRITON, name="frame_sparse_dkv_gpu")(idx, _flat(q), _flat(k), _flat(v), _flat(do), lse_f,
                                                             delta_f)
  shape = (b, h, dims.fq, dims.slots, dims.np_, d)
  return dq.reshape(q.shape), dk.reshape(shape), dv.reshape(shape)


attention = common.make_attention(_forward, _backward, default_multiple=16, pow2_channels=True)
