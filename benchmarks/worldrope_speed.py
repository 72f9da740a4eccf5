"""WorldRoPE's views of the sampler's cache: ``transform_keys(per_view=True)`` against the vectorised form, in one run.

  python benchmarks/worldrope_speed.py                       # the tables in BENCHMARKS.md
  python benchmarks/worldrope_speed.py --parts keys --reps 50

WorldRoPE (the default model's encoding) multiplies every key's h/w pairs by an expected rotary factor per query
view (``jaxwm.encodings.worldrope.transform_keys``). The sampler computes these views of its whole cache once per
chunk (``WorldRoPE.cache_views``). Until 2026-12-04 that was the vectorised ``transform_keys`` (the one training
differentiates) in a ``lax.map`` over layers; XLA:CPU fused its factor into the product with the keys and so
recomputed it for every head and channel, ran the 3x3 products as batched tiny dots, the sum over hypotheses as a
slow reduction and ``jnp.sin`` / ``jnp.cos`` as scalar calls. ``per_view=True`` loops over the query views with
the terms written out and ``jaxwm.ops.sincos``; ``cache_views`` vmaps it over layers.

Parts (``--parts``):
- ``keys``: one layer's ``transform_keys`` both ways, outputs compared.
- ``viewer``: the viewer's generation path (``jaxwm.play.engine.Player`` with the randomly initialised default
  model, as ``benchmarks/play_speed.py``): median chunk time of chunks 15-25 with the ``cache_views`` of before
  and of now, in the same process.
"""

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for configs/
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from jaxwm.encodings import worldrope as wr  # noqa: E402  pylint: disable=wrong-import-position

# --------------------------------------------------------------------------------------------------------------
# The baseline: the sampler's cache views before 2026-12-04 (the vectorised ``transform_keys``, a loop over layers).


def _old_cache_views(self, cfg, cache_keys, c2w, intrinsics):
  pairs, freqs = self._pairs(cfg)  # pylint: disable=protected-access
  pixels = cfg.patch_size[1] * cfg.camera.vae_stride
  q_k = intrinsics.astype(jnp.float32)

  def layer(k, mean, root, alpha):
    return wr.transform_keys(k.astype(cfg.compute_dtype), {"mean": mean, "root": root, "alpha": alpha}, q_k, c2w,
                             freqs, pairs, pixels)

  return {"wr_views": jax.lax.map(lambda a: layer(*a), tuple(cache_keys[n] for n in
                                                             ("k", "wr_mean", "wr_root", "wr_alpha")))}


class formulation:  # pylint: disable=invalid-name
  """``with formulation("before"):`` the baseline's ``WorldRoPE.cache_views``."""

  def __init__(self, which):
    self.which = which

  def __enter__(self):
    jax.clear_caches()  # the programs are traced again with the patched functions
    if self.which == "before":
      self.saved = type(wr.ENCODING).cache_views
      type(wr.ENCODING).cache_views = _old_cache_views
    return self

  def __exit__(self, *exc):
    if self.which == "before":
      type(wr.ENCODING).cache_views = self.saved
    jax.clear_caches()


# --------------------------------------------------------------------------------------------------------------


def _median_ms(fn, args, reps):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return 1e3 * float(np.median(times))


def _keys_inputs(b, lk, fq, heads=4, head_dim=48, m=4, seed=0):
  """Random keys and Gaussians of ``lk`` key tokens (8x8 tokens per frame of a 32x32 image, patch 4 pixels) and
  ``fq`` query cameras turning about the vertical axis."""
  rng = np.random.default_rng(seed)
  n = 64
  uv = np.tile(np.stack(np.meshgrid(np.arange(8) * 4 + 2.0, np.arange(8) * 4 + 2.0), -1).reshape(n, 2),
               (lk // n, 1))
  kmat = np.array([[28.0, 0, 16], [0, 28, 16], [0, 0, 1]], np.float32)

  def cam(yaw, t):
    c, s = np.cos(yaw), np.sin(yaw)
    out = np.eye(4, dtype=np.float32)
    out[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]
    out[:3, 3] = t
    return out

  key_c2w = np.stack([cam(0.1 * (i // n), [0.05 * (i // n), 0, 0]) for i in range(lk)])
  mean, root = wr.unproject_gaussians(jnp.asarray(uv, jnp.float32),
                                      jnp.asarray(rng.uniform(1, 4, (lk, m)), jnp.float32),
                                      jnp.asarray(rng.uniform(0.05, 0.5, (lk, m)), jnp.float32),
                                      jnp.asarray(np.tile(kmat, (lk, 1, 1))), jnp.asarray(key_c2w), 4.0)
  gauss = {"mean": jnp.broadcast_to(mean, (b,) + mean.shape), "root": jnp.broadcast_to(root, (b,) + root.shape),
           "alpha": jax.nn.softmax(jnp.asarray(rng.normal(size=(b, lk, m)), jnp.float32))}
  k = jnp.asarray(rng.normal(size=(b, lk, heads, head_dim)), jnp.float32)
  q_k = jnp.asarray(np.tile(kmat, (b, fq, 1, 1)))
  q_c2w = jnp.asarray(np.tile(np.stack([cam(0.2 * f, [0.0, 0.0, 0.1 * f]) for f in range(fq)]), (b, 1, 1, 1)))
  return k, gauss, q_k, q_c2w


def part_keys(reps):
  pairs = list(range(8, 24))  # head dim 48: the 16 h/w pairs, as the default model's "hw" channels
  freqs = wr.hw_frequencies(48, pairs)
  print("| keys x views (one layer) | vectorised ms | per_view=True ms | speed-up | max abs difference |")
  print("| --- | --- | --- | --- | --- |")
  for label, (b, lk, fq) in {"576 x 2 (window cache, chunk of 2)": (1, 576, 2),
                             "1536 x 2 (landmark cache, chunk of 2)": (1, 1536, 2),
                             "4160 x 2 (full cache, 65 frames)": (1, 4160, 2)}.items():
    k, gauss, q_k, q_c2w = _keys_inputs(b, lk, fq)
    row, outs = [], []
    for per_view in (False, True):
      g = jax.jit(lambda k_, g_, pv=per_view: wr.transform_keys(k_, g_, q_k, q_c2w, freqs, pairs, 4.0, per_view=pv))
      outs.append(g(k, gauss))
      row.append(_median_ms(g, (k, gauss), reps))
    diff = float(jnp.max(jnp.abs(outs[0] - outs[1])))
    print(f"| {label} | {row[0]:.2f} | {row[1]:.2f} | {row[0] / row[1]:.2f}x | {diff:.1e} |", flush=True)


def part_viewer(steps, policies, chunks):
  import play_speed as ps  # pylint: disable=g-import-not-at-top
  from jaxwm.play.engine import first_frame  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.controls import Controls  # pylint: disable=g-import-not-at-top
  config = ps.load_config("tiny")
  model, _ = ps.random_model(config, 65)
  first, k = first_frame(model, 0)
  controls = Controls(speed=0.05, turn=5.0)
  print("| memory | steps | before: chunk ~20 ms | frames/s | now: chunk ~20 ms | frames/s | speed-up |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for policy in policies:
    for st in steps:
      med = {}
      for which in ("before", "now"):
        with formulation(which):
          times, _ = ps.walk(model, first, k, policy, st, chunks, controls)
        med[which] = float(np.median(times[15:25]))
      b, n = med["before"], med["now"]
      print(f"| {policy} | {st} | {1e3 * b:.1f} | {model.chunk / b:.1f} | {1e3 * n:.1f} | {model.chunk / n:.1f} | "
            f"{b / n:.2f}x |", flush=True)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--parts", default="keys,viewer", help="comma-separated: keys, viewer")
  ap.add_argument("--reps", type=int, default=30, help="timed calls per row of the keys part")
  ap.add_argument("--steps", default="1,2,4", help="Euler steps per chunk of the viewer rows")
  ap.add_argument("--policies", default="window,landmark", help="memory policies of the viewer rows")
  ap.add_argument("--chunks", type=int, default=30, help="chunks per viewer walk (the median is over 15-25), >= 26")
  a = ap.parse_args()
  parts = a.parts.split(",")
  for p in parts:
    if p not in ("keys", "viewer"):
      ap.error(f"--parts: {p!r} is not one of keys, viewer")
  if a.chunks < 26:
    ap.error(f"--chunks={a.chunks}: must be >= 26 (the median is over chunks 15-25)")
  print(f"backend {jax.default_backend()}")
  if "keys" in parts:
    part_keys(a.reps)
  if "viewer" in parts:
    part_viewer([int(s) for s in a.steps.split(",")], a.policies.split(","), a.chunks)


if __name__ == "__main__":
  main()
