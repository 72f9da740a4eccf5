"""Long rollouts under each memory policy: time per chunk and process peak memory.

  python benchmarks/streaming.py [--frames 1001] [--steps 4]

The tiny config's model (randomly initialised: this measures cost, not quality) streams a
``--frames`` rollout in chunks of 2 latent frames along a trajectory that walks out and back
while turning. Per policy: median time of chunks 15-25 and 195-205 (and their ratio: bounded
policies should stay near 1), device cache slots, and the process's peak resident memory
after chunk 20, after chunk 200 and at the end (no growth once a bounded memory is full).
"""

import argparse
import pathlib
import resource
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for configs/
from configs import tiny  # pylint: disable=g-import-not-at-top,wrong-import-position
from jaxwm.data.procedural.clips import pinhole_intrinsics
from jaxwm.geometry.rotations import rotation_about_axis
from jaxwm.memory import make_policy
from jaxwm.models.conditioning import Cameras, Frames
from jaxwm.models.config import ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.sampling.streaming import StreamingSampler


def trajectory(n, image):
  """Out-and-back walk (8 units) with a slow yaw sweep: revisits for the banks to find."""
  s = np.linspace(0, 2 * np.pi, n)
  c2w = np.tile(np.eye(4), (n, 1, 1))
  c2w[:, 0, 3] = 4.0 * (1 - np.cos(s))
  c2w[:, 2, 3] = 1.5 * np.sin(2 * s)
  c2w[:, :3, :3] = np.asarray([rotation_about_axis(a, 1) for a in 0.8 * np.sin(3 * s)])
  k = np.repeat(pinhole_intrinsics((image, image), 70.0)[None], n, 0)
  return {"c2w": jnp.asarray(c2w, jnp.float32)[None], "intrinsics": jnp.asarray(k, jnp.float32)[None]}


def peak_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--frames", type=int, default=1001)
  p.add_argument("--steps", type=int, default=4, help="Euler steps per chunk")
  p.add_argument("--policies", nargs="+", default=["window", "landmark", "panorama", "full"])
  a = p.parse_args()
  config = tiny.get_config()
  cfg = ModelConfig.from_dict(config.model)
  model = WanModel(cfg)
  d = config.data
  lat = d.image_size // d.latent_stride
  ch = 3 * d.latent_stride ** 2
  cams = trajectory(a.frames, d.image_size)
  x = jnp.zeros((1, 1, lat, lat, ch))
  frames = Frames.sequence(1, 1, cameras=Cameras(cams["c2w"][:, :1], cams["intrinsics"][:, :1]))
  variables = nn.unbox(jax.jit(lambda k: model.init(k, x, jnp.zeros((1, 1)), frames))(jax.random.key(0)))
  first = jax.random.normal(jax.random.key(1), (1, 1, lat, lat, ch))
  chunk = config.recipe.chunk_size
  print(f"tiny model ({cfg.num_layers} layers, dim {cfg.dim}), {a.frames} frames, chunks of {chunk}, "
        f"{a.steps} Euler steps, {(lat // 2) ** 2} tokens/frame, backend {jax.default_backend()}")
  print("| memory | slots (frames) | chunk ~20 (ms) | chunk ~200 (ms) | ratio | total (s) | "
        "peak MiB @20 | @200 | end |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for name in a.policies:
    policy = make_policy(name, max_frames=a.frames, chunk_frames=chunk, image_hw=(d.image_size, d.image_size))
    sampler = StreamingSampler(model, variables, batch_size=1, max_frames=a.frames, latent_hw=(lat, lat),
                               channels=ch, num_steps=a.steps)
    stamps, peaks = [time.perf_counter()], {}

    def on_chunk(c, _):
      stamps.append(time.perf_counter())
      if c + 1 in (20, 200):
        peaks[c + 1] = peak_mib()

    t0 = time.perf_counter()
    sampler.rollout(first, a.frames, chunk, jax.random.key(2), cams, memory=policy, callback=on_chunk)
    total = time.perf_counter() - t0
    dt = np.diff(stamps) * 1e3
    early, late = np.median(dt[15:25]), np.median(dt[195:205])
    print(f"| {name} | {policy.capacity} | {early:.1f} | {late:.1f} | {late / early:.2f} | {total:.1f} | "
          f"{peaks.get(20, float('nan')):.0f} | {peaks.get(200, float('nan')):.0f} | {peak_mib():.0f} |", flush=True)


if __name__ == "__main__":
  main()
