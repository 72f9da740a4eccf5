"""Small layers with logical axis names on their parameters: the ground floor under `jaxwm.models` and
`jaxwm.encodings` (it imports neither)."""

import flax.linen as nn
import jax
import jax.numpy as jnp


def dense(features, axes, name, dtype=jnp.float32):
  """``nn.Dense`` whose kernel carries logical axis names ``axes`` (in, out) and bias ``axes[1]``."""
  return nn.Dense(features, name=name, dtype=dtype, param_dtype=jnp.float32,
                  kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (axes[1],)))


class RMSNorm(nn.Module):
  """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis, in float32 (q/k norm across heads)."""
  eps: float = 1e-6
  axis_name: str = "heads"

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), (self.axis_name,)),
                       (x.shape[-1],), jnp.float32)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + self.eps)
    return (y * scale).astype(x.dtype)


class LayerNorm(nn.Module):
  """LayerNorm in float32, optional affine (Wan's FP32LayerNorm)."""
  eps: float = 1e-6
  affine: bool = False

  @nn.compact
  def __call__(self, x):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, -1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), -1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
    if self.affine:
      d = x.shape[-1]
      y = y * self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)), (d,),
                         jnp.float32)
      y = y + self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)), (d,),
                         jnp.float32)
    return y


def batch_mesh_axes():
  """The mesh axes the logical ``batch`` axis maps to under the current ``nn.logical_axis_rules`` (``()``
  without rules): where a Pallas kernel's batch is split (``jaxwm.kernels.per_batch_shard``)."""
  spec = nn.logical_to_mesh_axes(("batch",))
  axes = spec[0] if spec else None
  return () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
