"""GPU (Triton lowering) chunked delta rule: one program per (batch, head) walks the chunks
with the state (forward) or its gradient (backward, in reverse) carried in registers.
``K``, ``V`` and the chunk must be powers of two (>= 16) on a real GPU."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.delta_rule import chunk_math
from pallas_kernels.delta_rule import common

# Triton lowering whatever jax's default Pallas GPU backend is (Mosaic GPU since jax 0.7).
_TRITON = pltriton.CompilerParams(num_warps=4, num_stages=2)

_f32 = jnp.float32


def _fwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, s0_ref, o_ref, st_ref, sf_ref, *, dims):
  c = dims.chunk
  dk = q_ref.shape[-1]

  def body(n, s):
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    st_ref[pl.ds(pl.multiple_of(n * dk, dk), dk), :] = s
    o, s_next, _ = chunk_math.chunk_forward(s, q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], g_ref[rows, :],
                                            b_ref[rows, :])
    o_ref[rows, :] = o.astype(o_ref.dtype)
    return s_next

  sf_ref[...] = jax.lax.fori_loop(0, dims.num_chunks, body, s0_ref[...].astype(_f32))


def _bwd_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, st_ref, do_ref, dsf_ref,
                dq_ref, dk_ref, dv_ref, dg_ref, db_ref, ds0_ref, *, dims):
  c = dims.chunk
  dk = q_ref.shape[-1]

  def body(step, ds):
    n = dims.num_chunks - 1 - step
    rows = pl.ds(pl.multiple_of(n * c, c), c)
    s = st_ref[pl.ds(pl.multiple_of(n * dk, dk), dk), :]
    ds, dq, dkk, dv, dg, db = chunk_math.chunk_backward(s, q_ref[rows, :], k_ref[rows, :], v_ref[rows, :],
                                                        g_ref[rows, :], b_ref[rows, :], do_ref[rows, :], ds)
    dq_ref[rows, :], dk_ref[rows, :], dv_ref[rows, :], dg_ref[rows, :], db_ref[rows, :] = dq, dkk, dv, dg, db
    return ds

  ds0_ref[...] = jax.lax.fori_loop(0, dims.num_chunks, body, dsf_ref[...])


def _whole(shape):
  """One (batch, head) slab of an array ``[B, H, ...]``."""
  return pl.BlockSpec((None, None) + tuple(shape), lambda b, h: (b, h) + (0,) * len(shape))


def forward(q, k, v, g, beta, s0, dims):
  b, h, t, dk = q.shape
  dv = v.shape[-1]
  o, states, s = pl.pallas_call(
      functools.partial(_fwd_kernel, dims=dims),
      grid=(b, h),
      in_specs=[_whole((t, dk)), _whole((t, dk)), _whole((t, dv)), _whole((t, dk)), _whole((t, 1)),
                _whole((dk, dv))],
      out_specs=[_whole((t, dv)), _whole((dims.num_chunks * dk, dv)), _whole((dk, dv))],
      out_shape=[jax.ShapeDtypeStruct((b, h, t, dv), _f32),
                 jax.ShapeDtypeStruct((b, h, dims.num_chunks * dk, dv), _f32),
                 jax.ShapeDtypeStruct((b, h, dk, dv), _f32)],
      interpret=dims.interpret, compiler_params=_TRITON, name="delta_rule_fwd_gpu")(q, k, v, g, beta, s0)
  return o, states, s


def backward(q, k, v, g, beta, states, do, ds_final, dims):
  b, h, t, dk = q.shape
  dv = v.shape[-1]
  specs = [_whole((t, dk)), _whole((t, dk)), _whole((t, dv)), _whole((t, dk)), _whole((t, 1))]
  return tuple(pl.pallas_call(
      functools.partial(_bwd_kernel, dims=dims),
      grid=(b, h),
      in_specs=specs + [_whole((dims.num_chunks * dk, dv)), _whole((t, dv)), _whole((dk, dv))],
      out_specs=specs + [_whole((dk, dv))],
      out_shape=[jax.ShapeDtypeStruct(x.shape, _f32) for x in (q, k, v, g, beta, ds_final)],
      interpret=dims.interpret, compiler_params=_TRITON, name="delta_rule_bwd_gpu")(q, k, v, g, beta, states, do, ds_final))


delta_rule = common.make_delta_rule(forward, backward, pow2_channels=True)
