"""MRoPE (ReWorld Eq. 1; docs/design.md §4): pose-indexed phases plus zero-initialised SE(3) residuals.

- Pose descriptor ``c_f = [vec(R_f); t_f]`` in R^12 (the model's poses, :func:`model_poses`), a
  zero-initialised MLP -> phase offsets ``delta_f [H, D/2]`` added to the RoPE angles of q and k on
  the camera channels.
- Values ``v' = v + W_v (P_f^-1 . v)`` and outputs ``out = W_o y + W_p (P_f . y)``, with ``P . x``
  acting on 4-channel tiles and ``W_v``, ``W_p`` zero-initialised.

At initialisation the model equals the 3D RoPE model. ReWorld divides translations by the window's
largest radius; jaxwm uses the fixed ``translation_scale`` instead (causal, docs/design.md §4).
"""

import flax.linen as nn
import jax.numpy as jnp

from jaxwm.encodings.base import per_token, tile_transform
from jaxwm.encodings.gta import GTA, TileTensors
from jaxwm.geometry.rotations import se3_inverse
from jaxwm.layers import dense


def pose_descriptor(c2w):
  """MRoPE's ``c_f = [vec(R_f); t_f]``: ``[B, S, 4, 4] -> [B, S, 12]``."""
  rot = c2w[..., :3, :3].reshape(c2w.shape[:-2] + (9,))
  return jnp.concatenate([rot, c2w[..., :3, 3]], -1).astype(jnp.float32)


def _zeros(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class MRoPE(GTA):
  """MRoPE: phases from the pose on q and k; SE(3) residuals on v and the output (per frame)."""
  name = "mrope"

  def tensors(self, cam_cfg, c2w, intrinsics, grid_hw, patch_hw):
    n = grid_hw[0] * grid_hw[1]
    return TileTensors(per_token(se3_inverse(c2w), n), per_token(c2w, n))

  def model_params(self, cfg):
    return (dense(cfg.camera.mrope_hidden, (None, "mlp"), "mrope_mlp_in", jnp.float32),
            nn.Dense(cfg.num_heads * cfg.head_dim // 2, name="mrope_mlp_out", kernel_init=_zeros(("mlp", "heads")),
                     bias_init=_zeros(("heads",))))

  def rope_offsets(self, cfg, params, c2w):
    mlp_in, mlp_out = params
    delta = mlp_out(nn.silu(mlp_in(pose_descriptor(c2w))))
    return delta.reshape(c2w.shape[:2] + (cfg.num_heads, cfg.head_dim // 2))

  def attention_params(self, cfg):
    dt = cfg.compute_dtype
    return (nn.Dense(cfg.head_dim, name="mrope_v", dtype=dt, use_bias=False, kernel_init=_zeros((None, None))),
            nn.Dense(cfg.dim, name="mrope_out", dtype=dt, use_bias=False, kernel_init=_zeros((None, "embed"))))

  def encode_q(self, q, cam, plan):
    return q

  def encode_kv(self, k, v, cam, plan, params):
    return k, v + params[0](tile_transform(v, cam.g_inv, plan.idx)[..., plan.idx])

  def decode(self, out, cam, plan, params):
    py = tile_transform(out, cam.g, plan.idx)[..., plan.idx]
    return out, params[1](py.reshape(py.shape[:2] + (-1,)))


ENCODING = MRoPE()
