"""Cost of each camera encoding per attention call, relative to ``rope3d``.

  python benchmarks/encoding_speed.py

For the tiny head shape (4 heads of 32) and the Wan2.2-5B one (24 heads of 128), one
self-attention call over ``frames x tokens`` tokens with per-token cameras: FLOPs from XLA's
cost analysis of the compiled call and CPU time, each as a ratio to ``rope3d``.
"""

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.encodings.base import Encoded, model_poses
from jaxwm.encodings.rope3d import rope3d_angles
from jaxwm.models.attention import Attention
from jaxwm.models.config import CameraConfig, ModelConfig
from jaxwm.models.transformer import token_positions

VARIANTS = [("rope3d", {}), ("viewrope", {}), ("viewrope all", {"channels": "all"}), ("gta", {}), ("prope", {}),
            ("prope per-token", {"per_token": True}), ("mrope", {}), ("worldrope", {"channels": "hw"})]
SHAPES = {"tiny": dict(dim=128, num_heads=4, grid=(4, 4), frames=8),
          "wan5b": dict(dim=3072, num_heads=24, grid=(15, 26), frames=4)}


def _call(shape, name, cam):
  enc = name.split()[0]
  cfg = ModelConfig(dim=shape["dim"], num_heads=shape["num_heads"], ffn_dim=4 * shape["dim"],
                    camera=CameraConfig(encoding=enc, **cam),
                    attention_impl="xla_lse")  # XLA's FLOP count sees no FLOP inside the C++ kernel (cpu_flash)
  grid, f = shape["grid"], shape["frames"]
  n = grid[0] * grid[1]
  x = jax.random.normal(jax.random.key(0), (1, f * n, cfg.dim))
  rng = np.random.default_rng(0)
  c2w = np.tile(np.eye(4, dtype=np.float32), (1, f, 1, 1))
  c2w[..., :3, 3] = rng.normal(size=(1, f, 3))
  k = np.tile(np.array([[64.0, 0, 64], [0, 64, 64], [0, 0, 1]], np.float32), (1, f, 1, 1))
  attn = Attention(cfg)
  pos = token_positions(jnp.arange(f, dtype=jnp.float32)[None], grid)
  rope = rope3d_angles(pos, cfg.head_dim)

  def queries(c2w, k):
    """What the model passes the attention layer: RoPE angles (per head for MRoPE) and camera tensors."""
    r = rope
    if enc == "mrope":  # phases per head, as the model adds them
      r = jnp.broadcast_to(rope[:, :, None, :], rope.shape[:2] + (cfg.num_heads, rope.shape[-1]))
    return Encoded(r, cfg.encoding.tensors(cfg.camera, model_poses(c2w, 1.0), k, grid, (2, 2)))

  def fn(params, x, c2w, k):
    return attn.apply(params, x, queries=queries(c2w, k))[0]

  params = jax.jit(lambda key: nn.unbox(attn.init(key, x, queries=queries(c2w, k))))(jax.random.key(1))
  compiled = jax.jit(fn).lower(params, x, c2w, k).compile()
  cost = compiled.cost_analysis()
  flops = float((cost[0] if isinstance(cost, list) else cost)["flops"])
  compiled(params, x, c2w, k).block_until_ready()
  t = time.perf_counter()
  reps = 5
  for _ in range(reps):
    compiled(params, x, c2w, k).block_until_ready()
  return flops, (time.perf_counter() - t) / reps


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--shapes", default="tiny,wan5b")
  args = p.parse_args()
  for sname in args.shapes.split(","):
    shape = SHAPES[sname]
    n = shape["grid"][0] * shape["grid"][1] * shape["frames"]
    print(f"\n{sname}: {shape['num_heads']} heads x {shape['dim'] // shape['num_heads']} channels, {n} tokens "
          f"({shape['frames']} frames of {shape['grid'][0]}x{shape['grid'][1]})")
    print(f"{'encoding':>16} {'GFLOP':>9} {'x rope3d':>9} {'ms':>9} {'x rope3d':>9}")
    base = None
    for name, cam in VARIANTS:
      flops, dt = _call(shape, name, cam)
      base = base or (flops, dt)
      print(f"{name:>16} {flops / 1e9:>9.3f} {flops / base[0]:>9.3f} {dt * 1e3:>9.2f} {dt / base[1]:>9.2f}")


if __name__ == "__main__":
  main()
