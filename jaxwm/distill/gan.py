"""DMD2's GAN term (Yin et al. 2024, "Improved Distribution Matching Distillation", §4.3): a discriminator on the
critic's features that tells re-noised real clips from re-noised student clips, so that real data, not only the
teacher, shapes the student.

The critic ``F`` (the fake score, ``W + LoRA_F``) already reads every re-noised chunk against its clean history
(:func:`jaxwm.distill.dmd.score_velocity`). Its last hidden state (the tokens after the transformer blocks, before
the output norm and head; ``WanModel`` sows it as ``features/hidden`` when that collection is mutable) feeds a
small head ``D`` applied per token (a patch discriminator): ``logit = w2 . silu(w1 . norm(h) + b1) + b2``.

Losses (non-saturating, DMD2's), ``softplus(z) = log(1 + e^z)``, means over the noisy chunks' tokens:

    critic:     L_D = mean softplus(-D(F(x_t^real))) + mean softplus(D(F(x_t^fake)))
    generator:  L_G = mean softplus(-D(F(x_t^fake)))

The critic's loss becomes ``flow_matching + gan_critic_weight * L_D`` (``F`` and ``D`` trained together, as DMD2
trains its classification branch with the fake score); the generator's ``dmd + gan_weight * L_G`` (the gradient
reaches ``G`` through ``x_t^fake = (1 - t) x0_G + t eps``; ``F`` and ``D`` held fixed). Real clips are the
training clips' own frames, each chunk against its real history, re-noised at the same kind of times.

Shapes: features ``[B, L, D]``; logits ``[B, L]``.
"""

import jax
import jax.numpy as jnp

FEATURES = "features"  # the mutable collection WanModel sows its last hidden state into


def init_head(key, dim):
  """The head's parameters: ``w1 [D, D]``, ``b1 [D]``, ``w2 [D, 1]``, ``b2 [1]`` (float32, LeCun normal)."""
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (dim, dim), jnp.float32) / jnp.sqrt(dim),
          "b1": jnp.zeros((dim,), jnp.float32),
          "w2": jax.random.normal(k2, (dim, 1), jnp.float32) / jnp.sqrt(dim),
          "b2": jnp.zeros((1,), jnp.float32)}


def logits(head, features, eps=1e-6):
  """``[B, L]`` float32 logits of ``features [B, L, D]``: a parameter-free layer norm, then the two-layer head."""
  h = features.astype(jnp.float32)
  h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + eps)
  return (jax.nn.silu(h @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"])[..., 0]


def critic_loss(real_logits, fake_logits):
  """``L_D = mean softplus(-real) + mean softplus(fake)`` (non-saturating; ``2 log 2`` at zero logits)."""
  return jnp.mean(jax.nn.softplus(-real_logits)) + jnp.mean(jax.nn.softplus(fake_logits))


def generator_loss(fake_logits):
  """``L_G = mean softplus(-fake)``: the student's samples scored as real."""
  return jnp.mean(jax.nn.softplus(-fake_logits))
