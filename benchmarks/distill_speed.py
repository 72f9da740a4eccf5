"""Streaming speed of a distilled student against its multi-step base (ReWorld §2.4): per-chunk time of the base
model at N Euler steps and of the merged student (base + LoRA, ``jaxwm.lora.merge``) at its few steps, in one run.

  python benchmarks/distill_speed.py [--base_steps 10,20,50] [--student_steps 4] [--chunks 12] [--config tiny]

The config's model (``configs/<--config>.py``, randomly initialised: this measures cost, not quality) streams
``--chunks`` chunks of ``recipe.chunk_size`` latent frames with the full KV cache
(:class:`jaxwm.sampling.streaming.StreamingSampler`). The student is the same model with a random rank-``--rank``
adapter merged once before streaming, so its forward is the base's: only the step count differs. A chunk costs
``steps`` denoising forwards plus one commit forward. Per setting: median and 90th-percentile time per chunk
(after one warm-up chunk, compilation excluded) and the speed-up over the first base row. Prints a markdown table.
"""

import argparse
import importlib
import pathlib
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for configs/
from jaxwm import lora  # pylint: disable=wrong-import-position
from jaxwm.models.conditioning import Cameras, Frames  # pylint: disable=wrong-import-position
from jaxwm.models.config import ModelConfig  # pylint: disable=wrong-import-position
from jaxwm.models.transformer import WanModel  # pylint: disable=wrong-import-position
from jaxwm.sampling.streaming import StreamingSampler  # pylint: disable=wrong-import-position


def trajectory(n):
  """A slow forward walk with a yaw sweep (any valid cameras: the cost does not depend on them)."""
  s = np.linspace(0.0, 1.0, n)
  c2w = np.tile(np.eye(4), (n, 1, 1))
  yaw = 0.5 * np.sin(2 * np.pi * s)
  c2w[:, 0, 0], c2w[:, 0, 2], c2w[:, 2, 0], c2w[:, 2, 2] = np.cos(yaw), np.sin(yaw), -np.sin(yaw), np.cos(yaw)
  c2w[:, 2, 3] = 2.0 * s
  k = np.tile(np.array([[30.0, 0, 16], [0, 30.0, 16], [0, 0, 1]]), (n, 1, 1))
  return {"c2w": jnp.asarray(c2w, jnp.float32)[None], "intrinsics": jnp.asarray(k, jnp.float32)[None]}


def chunk_times(sampler, first, cams, chunk, chunks, key):
  """Seconds per generated chunk (chunk 0 excluded: it compiles), device work included."""
  cache = sampler.start(first, Cameras.of(cams).frames(slice(0, 1)))
  times = []
  for c in range(chunks + 1):
    lo = 1 + c * chunk
    t = time.perf_counter()
    x, cache = sampler.generate(cache, jax.random.fold_in(key, c + 1), chunk, Cameras.of(cams).frames(slice(lo, lo + chunk)))
    jax.block_until_ready((x, cache))
    if c:
      times.append(time.perf_counter() - t)
  return np.asarray(times)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="tiny", help="configs/<name>.py (its model and data shapes)")
  p.add_argument("--base_steps", default="10,20,50", help="comma list of the base model's Euler steps")
  p.add_argument("--student_steps", type=int, default=4)
  p.add_argument("--rank", type=int, default=16, help="rank of the (random) student adapter")
  p.add_argument("--chunks", type=int, default=12, help="timed chunks per setting")
  p.add_argument("--batch", type=int, default=1)
  a = p.parse_args()
  config = importlib.import_module(f"configs.{a.config}").get_config()
  cfg = ModelConfig.from_dict(config.model)
  model = WanModel(cfg)
  d = config.data
  lat, ch = d.image_size // d.latent_stride, 3 * d.latent_stride**2
  chunk = config.recipe.chunk_size
  frames = 1 + (a.chunks + 1) * chunk
  cams = trajectory(frames)
  cams = jax.tree_util.tree_map(lambda x: jnp.repeat(x, a.batch, 0), cams)
  x = jnp.zeros((1, 1, lat, lat, ch))
  init_frames = Frames.sequence(1, 1, cameras=Cameras(cams["c2w"][:1, :1], cams["intrinsics"][:1, :1]))
  params = nn.unbox(jax.jit(lambda k: model.init(k, x, jnp.zeros((1, 1)), init_frames))(jax.random.key(0)))["params"]
  spec = lora.LoraSpec(rank=a.rank, alpha=float(a.rank))
  adapter = lora.init_lora(jax.random.key(1), params, spec)
  adapter = jax.tree_util.tree_map(lambda v: 0.01 * jax.random.normal(jax.random.key(2), v.shape, v.dtype), adapter)
  student = lora.merge(params, adapter, spec)
  first = jax.random.normal(jax.random.key(3), (a.batch, 1, lat, lat, ch))
  n_tok = (lat // cfg.patch_size[1]) * (lat // cfg.patch_size[2])
  print(f"{a.config} model ({cfg.num_layers} layers, dim {cfg.dim}), batch {a.batch}, chunks of {chunk} latent frames "
        f"({n_tok} tokens/frame), full cache of {frames} frames, {a.chunks} timed chunks, backend "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind}); student: rank-{a.rank} LoRA merged "
        f"({lora.lora_param_count(adapter) / 1e6:.3f}M values)")
  rows = [("base", int(s), params) for s in a.base_steps.split(",")] + [("student (merged LoRA)", a.student_steps,
                                                                         student)]
  out = ["| model | Euler steps | forwards / chunk | median ms / chunk | p90 ms / chunk | frames / s | speed-up |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
  ref = None
  for name, steps, p_ in rows:
    sampler = StreamingSampler(model, {"params": p_}, batch_size=a.batch, max_frames=frames, latent_hw=(lat, lat),
                               channels=ch, num_steps=steps, shift=config.sample.shift)
    t = chunk_times(sampler, first, cams, chunk, a.chunks, jax.random.key(4))
    med = float(np.median(t))
    ref = med if ref is None else ref
    out.append(f"| {name} | {steps} | {steps + 1} | {1e3 * med:.1f} | {1e3 * np.percentile(t, 90):.1f} | "
               f"{a.batch * chunk / med:.1f} | {ref / med:.2f}x |")
  print("\n".join(out))


if __name__ == "__main__":
  main()
