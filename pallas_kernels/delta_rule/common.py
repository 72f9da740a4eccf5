"""Shared wrapper of the delta-rule kernels: input preparation, padding, layout, ``custom_vjp``.

Kernels work per (batch, head) on ``[T, K]`` slabs with ``T`` a multiple of the chunk, the
scaled queries and the within-chunk cumulative log-decay. The forward kernel also returns the
state at the start of every chunk (``[B, H, N, K, V]``), which the backward kernel reads while
walking the chunks in reverse. Everything around the kernels (scale, cumulative sum,
padding, transposes) is ordinary JAX and is differentiated by JAX. Input checks and
preparation are the op's interface (``jaxwm.interfaces.delta_rule``), shared with the reference, so both agree.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxwm.interfaces import delta_rule as contract


@dataclasses.dataclass(frozen=True)
class Dims:
  chunk: int
  num_chunks: int
  interpret: object


def _pad_last(x, size, axis=-1):
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, pad)


def _pow2(n):
  return 1 << (n - 1).bit_length()


def make_delta_rule(forward, backward, pow2_channels=False):
  """``forward(q, k, v, g, beta, s0, dims) -> (o, states, s_final)``;
  ``backward(q, k, v, g, beta, states, do, ds_final, dims) -> (dq, dk, dv, dg, dbeta, ds0)``,
  all in the ``[B, H, T, ...]`` layout with ``beta [B, H, T, 1]``."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
  def core(q, k, v, g, beta, s0, dims):
    o, _, s = forward(q, k, v, g, beta, s0, dims)
    return o, s

  def core_fwd(q, k, v, g, beta, s0, dims):
    o, states, s = forward(q, k, v, g, beta, s0, dims)
    return (o, s), (q, k, v, g, beta, states)

  def core_bwd(dims, res, cot):
    q, k, v, g, beta, states = res
    do, ds = cot
    return backward(q, k, v, g, beta, states, do.astype(jnp.float32), ds.astype(jnp.float32), dims)

  core.defvjp(core_fwd, core_bwd)

  def delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
                 interpret=False):
    """Same contract as ``jaxwm.ops.delta_rule.delta_rule_chunked`` (``interpret=True``: CPU)."""
    dtype = v.dtype
    q, k, v, g, beta, s0 = contract.prepare_inputs(q, k, v, g, beta, scale, initial_state)
    dk, dv = q.shape[-1], v.shape[-1]
    if pow2_channels:  # zero channels: no key, value or state entry changes (Triton blocks are powers of two)
      q, k, g = (_pad_last(x, _pow2(dk)) for x in (q, k, g))
      v = _pad_last(v, _pow2(dv))
      s0 = _pad_last(_pad_last(s0, _pow2(dk), -2), _pow2(dv))
    b, t, h, _ = q.shape
    pad = (-t) % chunk_size
    q, k, v, g, beta = (contract.pad_time(x, pad) for x in (q, k, v, g, beta))
    n = (t + pad) // chunk_size
    g = jnp.cumsum(g.reshape(b, n, chunk_size, h, -1), axis=2).reshape(g.shape)
    to = lambda x: jnp.swapaxes(x, 1, 2)  # [B, T, H, ...] -> [B, H, T, ...]
    dims = Dims(chunk=chunk_size, num_chunks=n, interpret=interpret)
    o, s = core(to(q), to(k), to(v), to(g), to(beta)[..., None], s0, dims)
    o = jnp.swapaxes(o, 1, 2)[:, :t, :, :dv]
    return o.astype(dtype), (s[..., :dk, :dv] if output_final_state else None)

  return delta_rule
