"""Softmax attention whose backward keeps the log-sum-exp, not the probabilities (``impl='xla_lse'``).

JAX differentiating the reference (``jaxwm.ops.attention``) saves the softmax probabilities ``P [B, H, Lq, Lk]``
for the backward pass; inside the layer scan that is a stacked ``[layers, B, H, Lq, Lk]`` float32 buffer, zeroed,
written in the forward and read in the backward (236 MB per step for the default model's teacher-forcing
backbone). Here the forward saves the logits' inputs, ``v``, the output ``O`` and ``lse = m + log(sum(exp(S - m)))``
per query, and the backward recomputes ``P = exp(S - lse)`` (FlashAttention's backward, unblocked):

  S = logits(args) (masked: -inf),  P = softmax(S),  O = P v,
  dV = P^T dO,  dP = dO v^T,  dS = P * (dP - delta),  delta = rowsum(dO * O) (= rowsum(P * dP)),
  d args = the VJP of ``logits`` at ``args`` applied to dS.

``delta`` costs ``[Lq, D]`` instead of ``[Lq, Lk]``. The forward is the reference's arithmetic, op for op.
:func:`attention` is dense attention (``S = scale q k^T``); :func:`softmax_attention` takes any logits function
(WorldRoPE's per-view logits).
"""

import functools

import jax
import jax.numpy as jnp


def _masked(s, mask):
  if mask is None:
    return s
  return jnp.where(mask[:, None] if mask.ndim == 3 else mask, s, -jnp.inf)


def _forward(logits, args, v, mask):
  s = _masked(logits(*args), mask)
  m = jnp.max(s, axis=-1, keepdims=True)
  e = jnp.exp(s - m)
  total = jnp.sum(e, axis=-1, keepdims=True)
  out = jnp.einsum("bhqk,bkhd->bqhd", (e / total).astype(v.dtype), v)
  return out, m + jnp.log(total)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(logits, args, v, mask):
  return _forward(logits, args, v, mask)[0]


def _attention_fwd(logits, args, v, mask):
  out, lse = _forward(logits, args, v, mask)
  return out, (args, v, mask, out, lse)


def _attention_bwd(logits, res, g):
  args, v, mask, out, lse = res
  s, pull = jax.vjp(logits, *args)
  p = jnp.exp(_masked(s, mask) - lse)  # [B, H, Lq, Lk] float32; masked keys: exp(-inf) = 0
  g32 = g.astype(jnp.float32)
  dv = jnp.einsum("bhqk,bqhd->bkhd", p, g32)
  dp = jnp.einsum("bqhd,bkhd->bhqk", g32, v, preferred_element_type=jnp.float32)
  delta = jnp.einsum("bqhd,bqhd->bhq", g32, out.astype(jnp.float32))[..., None]
  dargs = pull((p * (dp - delta)).astype(s.dtype))
  return tuple(dargs), dv.astype(v.dtype), None  # the mask: no cotangent


_attention.defvjp(_attention_fwd, _attention_bwd)


def softmax_attention(logits, args, v, mask=None):
  """``softmax(logits(*args) + log(mask)) v`` (``jaxwm.ops.attention.softmax_attention``'s signature).

  ``logits(*args) -> [B, H, Lq, Lk]`` float32, already scaled (a function of arrays only, hashable: a module-level
  function or a ``functools.partial`` of one with static arguments); ``v [B, Lk, H, D]``; ``mask`` bool
  broadcastable to ``[B, Lq, Lk]`` or ``[B, H, Lq, Lk]`` (True = attend) or None; every query attends to at least
  one key. Returns ``[B, Lq, H, D]`` in ``v``'s dtype; gradients w.r.t. ``args`` and ``v``.
  """
  return _attention(logits, tuple(args), v, None if mask is None else jnp.asarray(mask))


def _dense_logits(q, k, *, scale):
  return jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale


def attention(q, k, v, mask=None, *, scale=None):
  """Dense attention, ``jaxwm.ops.attention.dot_product_attention``'s signature and result.

  ``q [B, Lq, H, D]``, ``k, v [B, Lk, H, D]``, ``mask`` as :func:`softmax_attention` (a frame mask with
  ``.tokens()`` is expanded). Returns ``[B, Lq, H, D]`` in ``q``'s dtype.
  """
  if mask is not None and hasattr(mask, "tokens") and not isinstance(mask, jax.Array):
    mask = mask.tokens()
  scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
  out = softmax_attention(functools.partial(_dense_logits, scale=scale), (q, k), v, mask)
  return out.astype(q.dtype)
