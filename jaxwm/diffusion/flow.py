"""Rectified flow matching (docs/design.md §9).

``x_t = (1 - t) x0 + t eps``, velocity target ``eps - x0``; sampling integrates
``dx/dt = v`` from ``t = 1`` to ``0`` with Euler steps on the shifted schedule
``t' = s t / (1 + (s - 1) t)``. The model sees timesteps on Wan's scale, ``1000 t``.
"""

import jax
import jax.numpy as jnp

TIMESTEP_SCALE = 1000.0


def noise(x0, eps, t):
  """``x_t = (1 - t) x0 + t eps`` with ``t`` broadcast from the left (``[B, S]`` against ``[B, S, ...]``)."""
  t = t.reshape(t.shape + (1,) * (x0.ndim - t.ndim))
  return (1.0 - t) * x0 + t * eps


def velocity_target(x0, eps):
  """The flow-matching regression target ``eps - x0``."""
  return eps - x0


def shift_timesteps(t, shift):
  """``s t / (1 + (s - 1) t)`` (``shift = 1`` is the identity)."""
  return shift * t / (1.0 + (shift - 1.0) * t)


def sampling_schedule(num_steps, shift=1.0):
  """``[num_steps + 1]`` decreasing times from 1 to 0 on the shifted schedule."""
  return shift_timesteps(jnp.linspace(1.0, 0.0, num_steps + 1), shift)


TIMESTEP_DISTRIBUTIONS = ("uniform", "logit_normal")


def sample_train_timesteps(key, shape, distribution="uniform", shift=1.0):
  """Training times in ``(0, 1)``: ``uniform`` or ``logit_normal`` (SD3), then shifted."""
  if distribution == "uniform":
    t = jax.random.uniform(key, shape, minval=1e-3, maxval=1.0)
  elif distribution == "logit_normal":
    t = jax.nn.sigmoid(jax.random.normal(key, shape))
  else:
    raise ValueError(f"timestep distribution must be one of {TIMESTEP_DISTRIBUTIONS}; got {distribution!r}")
  return shift_timesteps(t, shift)


def euler_step(x, v, t, t_next):
  """One Euler step of ``dx/dt = v`` from ``t`` to ``t_next`` (``t_next < t``)."""
  return x + (t_next - t) * v
