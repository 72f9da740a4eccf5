"""TPU (Mosaic) frame-sparse attention: ``PrefetchScalarGridSpec`` with the frame lists in SMEM.

Forward and ``dq``: the grid walks ``(batch, head, query frame, query block, slot, key block)``;
the key/value index maps read the prefetched frame list, so only selected key blocks are
copied to VMEM; online softmax in VMEM scratch. ``dk``/``dv``: the grid walks ``(batch, head,
query frame, slot, key block, query block)`` and sums over the query blocks of the frame; the
sum over query frames that selected the same key frame is done by ``common.accumulate_keys``.
A slot of -1 is skipped (its index map repeats frame 0, its compute is off).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.frame_sparse_attention import common

_f32 = jnp.float32


def _interpret(dims):
  if dims.interpret is True:
    return pltpu.InterpretParams()
  return dims.interpret


def _frame(idx_ref, dims, b, i, slot):
  return idx_ref[(b * dims.fq + i) * dims.slots + slot]


def _logits(q, k, dims, qb, kb):
  """Scaled logits of a (query block, key block) with padded keys masked; also the validity mask."""
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=_f32) * dims.scale
  col = kb * dims.block_k + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
  row = qb * dims.block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
  ok = (col < dims.n) & (row < dims.n)
  return jnp.where(col < dims.n, s, common.NEG), ok


def _fwd_kernel(idx_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc, *, dims):
  b, i, qb, slot, kb = (pl.program_id(a) for a in (0, 2, 3, 4, 5))

  @pl.when((slot == 0) & (kb == 0))
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, _f32)
    l_sc[...] = jnp.zeros(l_sc.shape, _f32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, _f32)

  @pl.when(_frame(idx_ref, dims, b, i, slot) >= 0)
  def _step():
    s, _ = _logits(q_ref[...], k_ref[...], dims, qb, kb)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=_f32)
    m_sc[...] = m_new

  @pl.when((slot == dims.slots - 1) & (kb == dims.nk - 1))
  def _finish():
    o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)
    lse_ref[...] = m_sc[...] + jnp.log(l_sc[...])


def _dq_kernel(idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, acc_sc, *, dims):
  b, i, qb, slot, kb = (pl.program_id(a) for a in (0, 2, 3, 4, 5))

  @pl.when((slot == 0) & (kb == 0))
  def _init():
    acc_sc[...] = jnp.zeros(acc_sc.shape, _f32)

  @pl.when(_frame(idx_ref, dims, b, i, slot) >= 0)
  def _step():
    k, v = k_ref[...], v_ref[...]
    s, ok = _logits(q_ref[...], k, dims, qb, kb)
    p = jnp.where(ok, jnp.exp(s - lse_ref[...]), 0.0)
    dp = jax.lax.dot_general(do_ref[...], v, (((1,), (1,)), ((), ())), preferred_element_type=_f32)
    ds = p * (dp - delta_ref[...])
    acc_sc[...] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=_f32) * dims.scale

  @pl.when((slot == dims.slots - 1) & (kb == dims.nk - 1))
  def _finish():
    dq_ref[...] = acc_sc[...].astype(dq_ref.dtype)


def _dkv_kernel(idx_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_sc, dv_sc, *, dims):
  b, i, slot, kb, qb = (pl.program_id(a) for a in (0, 2, 3, 4, 5))

  @pl.when(qb == 0)
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, _f32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, _f32)

  @pl.when(_frame(idx_ref, dims, b, i, slot) >= 0)
  def _step():
    q, do = q_ref[...], do_ref[...]
    s, ok = _logits(q, k_ref[...], dims, qb, kb)
    p = jnp.where(ok, jnp.exp(s - lse_ref[...]), 0.0)
    dv_sc[...] += jax.lax.dot_general(p.astype(do.dtype), do, (((0,), (0,)), ((), ())), preferred_element_type=_f32)
    dp = jax.lax.dot_general(do, v_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=_f32)
    ds = p * (dp - delta_ref[...])
    dk_sc[...] += jax.lax.dot_general(ds.astype(q.dtype), q, (((0,), (0,)), ((), ())),
                                      preferred_element_type=_f32) * dims.scale

  @pl.when(qb == dims.nq - 1)
  def _finish():
    dk_ref[...] = dk_sc[...]
    dv_ref[...] = dv_sc[...]


def _specs(dims, d):
  """Index maps over grid ``(b, h, i, qb, slot, kb)``: query-side and (selected) key-side blocks."""
  def key_frame(idx_ref, b, i, slot):
    return jnp.maximum(_frame(idx_ref, dims, b, i, slot), 0)
  q_spec = pl.BlockSpec((None, None, None, dims.block_q, d), lambda b, h, i, qb, s, kb, idx: (b, h, i, qb, 0))
  row_spec = pl.BlockSpec((None, None, None, dims.block_q, 1), lambda b, h, i, qb, s, kb, idx: (b, h, i, qb, 0))
  k_spec = pl.BlockSpec((None, None, None, dims.block_k, d),
                        lambda b, h, i, qb, s, kb, idx: (b, h, key_frame(idx, b, i, s), kb, 0))
  return q_spec, row_spec, k_spec


def _forward(q, k, v, idx, dims):
  b, h, _, _, d = q.shape
  q_spec, row_spec, k_spec = _specs(dims, d)
  grid = (b, h, dims.fq, dims.nq, dims.slots, dims.nk)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, dims=dims),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=grid, in_specs=[q_spec, k_spec, k_spec], out_specs=[q_spec, row_spec],
          scratch_shapes=[pltpu.VMEM((dims.block_q, 1), _f32), pltpu.VMEM((dims.block_q, 1), _f32),
                          pltpu.VMEM((dims.block_q, d), _f32)]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:4] + (1,), _f32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "parallel", "arbitrary", "arbitrary")),
      interpret=_interpret(dims), name="frame_sparse_fwd_tpu")(idx, q, k, v)


def _backward(q, k, v, idx, o, lse, do, dims):
  b, h, _, _, d = q.shape
  delta = jnp.sum(o.astype(_f32) * do.astype(_f32), axis=-1, keepdims=True)
  q_spec, row_spec, k_spec = _specs(dims, d)
  sem = ("parallel", "parallel", "parallel", "parallel", "arbitrary", "arbitrary")
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, dims=dims),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(b, h, dims.fq, dims.nq, dims.slots, dims.nk),
          in_specs=[q_spec, k_spec, k_spec, q_spec, row_spec, row_spec], out_specs=q_spec,
          scratch_shapes=[pltpu.VMEM((dims.block_q, d), _f32)]),
      out_shape=jax.ShapeDtypeStruct(q.shape, _f32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem),
      interpret=_interpret(dims), name="frame_sparse_dq_tpu")(idx, q, k, v, do, lse, delta)

  # grid (b, h, i, slot, kb, qb): the query blocks of a frame are the innermost reduction.
  def key_frame(idx_ref, b_, i, s):
    return jnp.maximum(_frame(idx_ref, dims, b_, i, s), 0)
  qs = pl.BlockSpec((None, None, None, dims.block_q, d), lambda b_, h_, i, s, kb, qb, ix: (b_, h_, i, qb, 0))
  rs = pl.BlockSpec((None, None, None, dims.block_q, 1), lambda b_, h_, i, s, kb, qb, ix: (b_, h_, i, qb, 0))
  ks = pl.BlockSpec((None, None, None, dims.block_k, d),
                    lambda b_, h_, i, s, kb, qb, ix: (b_, h_, key_frame(ix, b_, i, s), kb, 0))
  outs = pl.BlockSpec((None, None, None, None, dims.block_k, d), lambda b_, h_, i, s, kb, qb, ix: (b_, h_, i, s, kb, 0))
  part = jax.ShapeDtypeStruct((b, h, dims.fq, dims.slots, dims.np_, d), _f32)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, dims=dims),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(b, h, dims.fq, dims.slots, dims.nk, dims.nq),
          in_specs=[qs, ks, ks, qs, rs, rs], out_specs=[outs, outs],
          scratch_shapes=[pltpu.VMEM((dims.block_k, d), _f32), pltpu.VMEM((dims.block_k, d), _f32)]),
      out_shape=[part, part],
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem),
      interpret=_interpret(dims), name="frame_sparse_dkv_tpu")(idx, q, k, v, do, lse, delta)
  return dq, dk, dv


attention = common.make_attention(_forward, _backward, default_multiple=8)
