"""The gated delta rule's interface (``jaxwm.ops.delta_rule`` and ``pallas_kernels.delta_rule``): shapes checked
with one-line errors naming the argument, and the float32 inputs every implementation starts from.

Layout ``[B, T, H, K]``; ``g`` per channel ``[B, T, H, K]`` (KDA) or per head ``[B, T, H]`` (Gated DeltaNet);
``beta [B, T, H]``; ``initial_state [B, H, K, V]``.
"""

import jax.numpy as jnp

_f32 = jnp.float32


def check_inputs(q, k, v, g, beta, initial_state):
  """Raises ``ValueError`` naming the argument unless ``q, k [B, T, H, K]``, ``v [B, T, H, V]``,
  ``g [B, T, H]`` or ``[B, T, H, K]``, ``beta [B, T, H]``, ``initial_state [B, H, K, V]`` or None."""
  b, t, h, dk = q.shape
  if k.shape != q.shape:
    raise ValueError(f"k shape {k.shape} must equal q shape {q.shape}")
  if v.shape[:3] != (b, t, h):
    raise ValueError(f"v shape {v.shape} must start with (B, T, H) = {(b, t, h)}")
  if g.shape not in ((b, t, h), (b, t, h, dk)):
    raise ValueError(f"g shape {g.shape} must be (B, T, H) = {(b, t, h)} or (B, T, H, K) = {(b, t, h, dk)}")
  if beta.shape != (b, t, h):
    raise ValueError(f"beta shape {beta.shape} must be (B, T, H) = {(b, t, h)}")
  if initial_state is not None and initial_state.shape != (b, h, dk, v.shape[-1]):
    raise ValueError(f"initial_state shape {initial_state.shape} must be (B, H, K, V) = {(b, h, dk, v.shape[-1])}")


def prepare_inputs(q, k, v, g, beta, scale, initial_state):
  """Checked float32 copies: ``(scale * q, k, v, g [B, T, H, K] per channel, beta, S_0 [B, H, K, V])``;
  ``scale`` None is ``K ** -0.5``, ``initial_state`` None is zeros."""
  check_inputs(q, k, v, g, beta, initial_state)
  b, _, h, dk = q.shape
  scale = dk**-0.5 if scale is None else scale
  q, k, v, g, beta = (x.astype(_f32) for x in (q, k, v, g, beta))
  if g.ndim == 3:
    g = jnp.broadcast_to(g[..., None], q.shape)
  s0 = jnp.zeros((b, h, dk, v.shape[-1]), _f32) if initial_state is None else initial_state.astype(_f32)
  return q * scale, k, v, g, beta, s0


def pad_time(x, pad):
  """``x [B, T, ...]`` zero-padded to ``[B, T + pad, ...]`` (with ``beta = 0``, ``g = 0``: a no-op step)."""
  return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if pad else x


