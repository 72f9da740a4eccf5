"""TPU (Mosaic) chunked delta rule: grid ``(batch, head, chunk)``, the chunk axis sequential
("arbitrary"), the running state (forward) or its gradient (backward, chunks in reverse) in a
VMEM scratch buffer."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.delta_rule import chunk_math
from pallas_kernels.delta_rule import common

_f32 = jnp.float32
_SEM = ("parallel", "parallel", "arbitrary")


def _interpret(dims):
  return pltpu.InterpretParams() if dims.interpret is True else dims.interpret


def _fwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, st_ref, sf_ref, s_sc, *, dims):
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _init():
    s_sc[...] = s0_ref[...]

  st_ref[...] = s_sc[...]
  o, s_next, _ = chunk_math.chunk_forward(s_sc[...], q_ref[...], k_ref[...], v_ref[...], g_ref[...], b_ref[...])
  o_ref[...] = o.astype(o_ref.dtype)
  s_sc[...] = s_next

  @pl.when(n == dims.num_chunks - 1)
  def _final():
    sf_ref[...] = s_next


def _bwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, st_ref, do_ref, dsf_ref,
                dq_ref, dk_ref, dv_ref, dg_ref, db_ref, ds0_ref, ds_sc, *, dims):
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _init():
    ds_sc[...] = dsf_ref[...]

  ds, dq, dk, dv, dg, db = chunk_math.chunk_backward(st_ref[...], q_ref[...], k_ref[...], v_ref[...], g_ref[...],
                                                     b_ref[...], do_ref[...], ds_sc[...])
  dq_ref[...], dk_ref[...], dv_ref[...], dg_ref[...], db_ref[...] = dq, dk, dv, dg, db
  ds_sc[...] = ds

  @pl.when(n == dims.num_chunks - 1)
  def _first():
    ds0_ref[...] = ds


def _specs(dims, dk, dv, reverse):
  c = dims.chunk
  at = (lambda n: dims.num_chunks - 1 - n) if reverse else (lambda n: n)
  tok = lambda width: pl.BlockSpec((None, None, c, width), lambda b, h, n: (b, h, at(n), 0))
  state = pl.BlockSpec((None, None, dk, dv), lambda b, h, n: (b, h, 0, 0))
  per_chunk = pl.BlockSpec((None, None, None, dk, dv), lambda b, h, n: (b, h, at(n), 0, 0))
  return tok, state, per_chunk


def forward(q, k, v, g, beta, s0, dims):
  b, h, t, dk = q.shape
  dv = v.shape[-1]
  tok, state, per_chunk = _specs(dims, dk, dv, reverse=False)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, dims=dims),
      grid=(b, h, dims.num_chunks),
      in_specs=[tok(dk), tok(dk), tok(dv), tok(dk), tok(1), state],
      out_specs=[tok(dv), per_chunk, state],
      out_shape=[jax.ShapeDtypeStruct((b, h, t, dv), _f32),
                 jax.ShapeDtypeStruct((b, h, dims.num_chunks, dk, dv), _f32),
                 jax.ShapeDtypeStruct((b, h, dk, dv), _f32)],
      scratch_shapes=[pltpu.VMEM((dk, dv), _f32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=_SEM),
      interpret=_interpret(dims), name="delta_rule_fwd_tpu")(q, k, v, g, beta, s0)


def backward(q, k, v, g, beta, states, do, ds_final, dims):
  b, h, t, dk = q.shape
  dv = v.shape[-1]
  tok, state, per_chunk = _specs(dims, dk, dv, reverse=True)
  return tuple(pl.pallas_call(
      functools.partial(_bwd_kernel, dims=dims),
      grid=(b, h, dims.num_chunks),
      in_specs=[tok(dk), tok(dk), tok(dv), tok(dk), tok(1), per_chunk, tok(dv), state],
      out_specs=[tok(dk), tok(dk), tok(dv), tok(dk), tok(1), state],
      out_shape=[jax.ShapeDtypeStruct(x.shape, _f32) for x in (q, k, v, g, beta, ds_final)],
      scratch_shapes=[pltpu.VMEM((dk, dv), _f32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=_SEM),
      interpret=_interpret(dims), name="delta_rule_bwd_tpu")(q, k, v, g, beta, states, do, ds_final))


delta_rule = common.make_delta_rule(forward, backward)
