"""Timestep and conditioning embeddings of the Wan DiT."""

import math

import flax.linen as nn
import jax.numpy as jnp

from jaxwm.layers import dense


def sinusoidal_embedding(t, dim, max_period=10000.0):
  """Wan/diffusers timestep embedding ``[cos(t f), sin(t f)]``, ``f_i = max_period^(-i / (dim/2))``.

  Args:
    t: ``[...]`` timesteps (Wan scale: 0..1000).

  Returns:
    ``[..., dim]`` float32.
  """
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = t.astype(jnp.float32)[..., None] * freqs
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)


class TimeEmbedding(nn.Module):
  """``temb = W2 silu(W1 sin(t))`` and the shared modulation ``W3 silu(temb)`` (6 chunks).

  Returns ``(temb [..., dim], modulation [..., 6, dim])`` in float32.
  """
  dim: int
  freq_dim: int

  @nn.compact
  def __call__(self, t):
    x = sinusoidal_embedding(t, self.freq_dim)
    temb = dense(self.dim, ("freq", "embed"), "time_embedder_1")(x)
    temb = dense(self.dim, ("mlp", "embed"), "time_embedder_2")(nn.silu(temb))
    mod = dense(6 * self.dim, ("embed", "mlp"), "time_proj")(nn.silu(temb))
    return temb, mod.reshape(mod.shape[:-1] + (6, self.dim))


class TextProjection(nn.Module):
  """``W2 gelu_tanh(W1 x)`` (PixArt-alpha text projection)."""
  dim: int

  @nn.compact
  def __call__(self, x):
    x = dense(self.dim, ("text_embed", "embed"), "linear_1")(x)
    return dense(self.dim, ("mlp", "embed"), "linear_2")(nn.gelu(x, approximate=True))
