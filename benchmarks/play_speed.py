"""Frames per second and per-chunk latency through the viewer's generation path (no browser).

  python benchmarks/play_speed.py                                   # the table in BENCHMARKS.md
  python benchmarks/play_speed.py --configs tiny --steps 4 --policies window --chunks 30 --far 0   # a quick look

Each row is one :class:`jaxwm.play.engine.Player` walk (what the server runs per chunk: poses from the held keys,
the session's chunk, decoding to uint8 frames) with ``w`` and the right arrow held, so the camera circles and
comes back past what it saw. Models: ``--configs`` (``tiny``: the default job's model; ``recipe_cpu:w384``: the
width-384 recipe), randomly initialised (cost, not quality; a merged LoRA adapter has the same shapes, so the
cost with ``--adapter`` is the same). Per row: the median wall time of chunks 15-25 and, with ``--far N``, of the
10 chunks after chunk ``N`` (bounded policies should stay flat), frames per second from the median (chunk
frames / time), and the process's peak resident memory. The baseline in the same run is the rollout of
:mod:`jaxwm.sampling.streaming` on the same poses (``rollout`` column: the sampler without the viewer's
per-chunk work); the viewer should cost no more than a few percent above it. "programs alone": the chunk's
compiled programs (the cache's views, the denoising scan, the commit forward) timed again on their own with the
arguments of chunk 20: the gap to
the chunk's time is the sampler's host work (memory-policy bookkeeping, slot moves, noise, transfers).
"per-step views": with ``--per-step-views 1`` the same walk again with the encoding's ``cache_views`` switched off,
so every Euler step's forward transforms the cached keys for the chunk's views again (WorldRoPE; the sampler before
2026-12-04): the baseline of hoisting them out of the denoising loop, measured in the same run. "concatenated
cache": with ``--concat-cache 1`` the same walk again with WorldRoPE's cached keys concatenated to the chunk's in
every layer of every forward (the sampler's attention before the two-block softmax of
``worldrope.per_view_attention_cached``).
"""

import argparse
import contextlib
import functools
import importlib
import pathlib
import resource
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for configs/

from jaxwm.models.conditioning import Cameras, Frames  # noqa: E402  pylint: disable=wrong-import-position
from jaxwm.ops import attention as attn_ref  # noqa: E402  pylint: disable=wrong-import-position
from jaxwm.models.config import ModelConfig  # noqa: E402  pylint: disable=wrong-import-position
from jaxwm.models.transformer import WanModel  # noqa: E402  pylint: disable=wrong-import-position
from jaxwm.play.engine import Model, Player, first_frame  # noqa: E402  pylint: disable=wrong-import-position
from jaxwm.sampling.controls import Controls  # noqa: E402  pylint: disable=wrong-import-position
from xla_kernels import softmax_attention as xla_attention  # noqa: E402  pylint: disable=wrong-import-position

KEYS = ("w", "right")


def load_config(name):
  module, _, variant = name.partition(":")
  mod = importlib.import_module(f"configs.{module}")
  return mod.get_config(variant) if variant else mod.get_config()


def random_model(config, max_frames):
  cfg = ModelConfig.from_dict(config.model)
  model = WanModel(cfg)
  d = config.data
  lat, ch = d.image_size // d.latent_stride, 3 * d.latent_stride**2
  x = jnp.zeros((1, 1, lat, lat, ch))
  cams = Cameras(jnp.tile(jnp.eye(4), (1, 1, 1, 1)), jnp.tile(jnp.eye(3), (1, 1, 1, 1)))
  variables = nn.unbox(jax.jit(lambda k: model.init(k, x, jnp.zeros((1, 1)), Frames.sequence(1, 1, cameras=cams)))(
      jax.random.key(0)))
  return Model(config, model, variables, 0, max_frames=max_frames), cfg


def peak_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def walk(model, first, k, policy, steps, chunks, controls):
  """``(per-chunk wall times [chunks], c2w of every frame)`` of a Player walk."""
  p = Player(model, first, k, memory=policy, steps=steps, controls=controls)
  times, poses = [], [np.eye(4)]
  for _ in range(chunks):
    t0 = time.perf_counter()
    out = p.step(KEYS)
    times.append(time.perf_counter() - t0)
    del out
  poses.extend(controls.chunk(np.eye(4), chunks * model.chunk, KEYS))
  return np.asarray(times), np.stack(poses)


def forward_floor(model, first, k, policy, steps, controls, warm=20, reps=7):
  """Median ms of the chunk's compiled programs alone (the denoising scan and the commit forward, called again
  with the arguments chunk ``warm`` gave them, outputs waited for): what the sampler's per-chunk time cannot go
  below without changing the programs."""
  from jaxwm.sampling import streaming  # pylint: disable=g-import-not-at-top
  p = Player(model, first, k, memory=policy, steps=steps, controls=controls)
  for _ in range(warm):
    p.step(KEYS)
  calls, originals = [], (streaming._denoise_jit, streaming._commit_jit, streaming._views_jit)  # pylint: disable=protected-access

  def recorder(fn, donated):
    def call(*args, **kwargs):
      saved = [jax.tree_util.tree_map(jnp.copy, a) if i in donated else a for i, a in enumerate(args)]
      calls.append((fn, saved, kwargs, donated))
      return fn(*args, **kwargs)
    return call

  streaming._denoise_jit = recorder(originals[0], ())  # pylint: disable=protected-access
  streaming._commit_jit = recorder(originals[1], (2,))  # pylint: disable=protected-access
  streaming._views_jit = recorder(originals[2], ())  # pylint: disable=protected-access
  try:
    p.step(KEYS)
  finally:
    streaming._denoise_jit, streaming._commit_jit, streaming._views_jit = originals  # pylint: disable=protected-access
  total = 0.0
  for fn, args, kwargs, donated in calls:
    times = []
    for _ in range(reps):
      fresh = [jax.tree_util.tree_map(jnp.copy, a) if i in donated else a for i, a in enumerate(args)]
      jax.block_until_ready(fresh)
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*fresh, **kwargs))
      times.append(time.perf_counter() - t0)
    total += float(np.median(times))
  return total, len(calls)


def rollout_times(model, first, k, policy, steps, c2w):
  """Per-chunk wall times of the plain sampler's rollout on the same poses (the baseline)."""
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.streaming import StreamingSampler  # pylint: disable=g-import-not-at-top
  ae, (h, w) = model.autoencoder, model.frame_hw
  n, chunk = len(c2w), model.chunk
  sampler = StreamingSampler(model.model, model.variables, batch_size=1, max_frames=model.max_frames,
                             latent_hw=(h // ae.spatial_stride, w // ae.spatial_stride), channels=ae.channels,
                             num_steps=steps, shift=model.config.sample.shift)
  mem = make_policy(policy, max_frames=model.max_frames, chunk_frames=chunk, image_hw=(h, w))
  stamps = [time.perf_counter()]
  cams = {"c2w": np.asarray(c2w, np.float32)[None], "intrinsics": np.tile(k, (n, 1, 1)).astype(np.float32)[None]}
  first_latent = ae.encode(jnp.asarray(first)[None, None])

  def on_chunk(c, latents):
    np.asarray(latents)  # waits for the chunk, as the viewer does
    stamps.append(time.perf_counter())

  if policy == "full":
    sampler.rollout(first_latent, n, chunk, jax.random.key(0), {k_: jnp.asarray(v) for k_, v in cams.items()},
                    memory=mem, callback=on_chunk)
  else:  # a bounded policy: the session (rollout needs max_frames >= n)
    s = sampler.session(first_latent, jax.random.key(0), {k_: jnp.asarray(v[:, :1]) for k_, v in cams.items()},
                        memory=mem, keep_frames=False)
    for c in range((n - 1) // chunk):  # host slices (a jnp slice per chunk would compile a new program each time)
      sl = slice(1 + c * chunk, 1 + (c + 1) * chunk)
      np.asarray(s.next({k_: jnp.asarray(v[:, sl]) for k_, v in cams.items()}))
      stamps.append(time.perf_counter())
  return np.diff(stamps)


@contextlib.contextmanager
def per_step_views(cfg):
  """The encoding's views of the cache computed in every forward again (``cache_views`` returns nothing)."""
  enc = cfg.encoding
  jax.clear_caches()  # the sampler's programs are traced again without the hoisted views
  enc.cache_views = lambda *a, **kw: {}
  try:
    yield
  finally:
    del enc.cache_views
    jax.clear_caches()


@contextlib.contextmanager
def concatenated_cache():
  """WorldRoPE's sampler forwards with the cache's keys, views and values concatenated with the chunk's in every
  layer (the sampler's attention until 2026-12-04 night), instead of the two-block softmax of
  ``per_view_attention_cached``."""
  from jaxwm.encodings import worldrope as wr  # pylint: disable=g-import-not-at-top
  saved = wr.per_view_attention_cached

  def joined(q, cache, own, mask, channels):
    cat = lambda i, axis: jnp.concatenate([cache[i], own[i]], axis)  # pylint: disable=unnecessary-lambda-assignment
    rest = np.setdiff1d(np.arange(q.shape[-1]), channels)
    logits = functools.partial(attn_ref.per_view_logits, scale=q.shape[-1] ** -0.5)
    args = (q[..., channels], cat(1, 2), q[..., rest], cat(0, 1)[..., rest])
    return xla_attention.softmax_attention(logits, args, cat(2, 1), mask).astype(q.dtype)

  jax.clear_caches()
  wr.per_view_attention_cached = joined
  try:
    yield
  finally:
    wr.per_view_attention_cached = saved
    jax.clear_caches()


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--configs", default="tiny,recipe_cpu:w384")
  ap.add_argument("--steps", default="1,2,4", help="Euler steps per chunk (comma-separated)")
  ap.add_argument("--policies", default="window,landmark,panorama,full")
  ap.add_argument("--chunks", type=int, default=30, help="chunks of every row (the median is over 15-25)")
  ap.add_argument("--far", type=int, default=2000, help="also time the 10 chunks after this one (0: no)")
  ap.add_argument("--far-steps", type=int, default=1, help="Euler steps of the --far rows")
  ap.add_argument("--far-configs", default="tiny", help="configs of the --far rows")
  ap.add_argument("--floor", type=int, default=1, help="1: also time the chunk's compiled programs alone")
  ap.add_argument("--per-step-views", type=int, default=0,
                  help="1: also time the walk with the cache's views computed in every Euler step (the baseline)")
  ap.add_argument("--concat-cache", type=int, default=0,
                  help="1: also time the walk with the cache concatenated to the chunk in every forward (the baseline)")
  a = ap.parse_args(argv)
  steps = [int(s) for s in a.steps.split(",") if s]
  if a.chunks < 26:
    ap.error(f"--chunks={a.chunks}: must be >= 26 (the median is over chunks 15-25)")
  controls = Controls(speed=0.05, turn=5.0)
  print(f"backend {jax.default_backend()}, {jax.local_device_count()} device(s); keys held: {' + '.join(KEYS)}")
  print("| model | memory | steps | chunk ~20 (ms) | frames/s | rollout ~20 (ms) | viewer / rollout | programs alone (ms) |"
        " chunk / programs | chunk ~far (ms) | far / 20 | per-step views ~20 (ms) | hoisting speed-up |"
        " concatenated cache ~20 (ms) | two-block speed-up | peak MiB |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for name in a.configs.split(","):
    config = load_config(name)
    chunk = int(config.recipe.chunk_size)
    max_frames = 1 + chunk * max(a.chunks, 32)
    model, cfg = random_model(config, max_frames)
    first, k = first_frame(model, 0)
    label = f"{name} ({cfg.num_layers}x{cfg.dim}, {(model.frame_hw[0] // config.data.latent_stride // cfg.patch_size[1]) ** 2} tok/frame)"
    for policy in a.policies.split(","):
      for st in steps:
        times, c2w = walk(model, first, k, policy, st, a.chunks, controls)
        base = rollout_times(model, first, k, policy, st, c2w)
        med, bmed = np.median(times[15:25]), np.median(base[15:25])
        far_cell = ratio = "-"
        if a.far and policy != "full" and st == a.far_steps and name in a.far_configs.split(","):
          far_times, _ = walk(model, first, k, policy, st, a.far + 10, controls)
          fmed = np.median(far_times[a.far:])
          far_cell, ratio = f"{1e3 * fmed:.1f}", f"{fmed / med:.2f}"
        floor, _ = forward_floor(model, first, k, policy, st, controls) if a.floor else (float("nan"), 0)
        unhoisted = gain = "-"
        if a.per_step_views:
          with per_step_views(cfg):
            old_times, _ = walk(model, first, k, policy, st, a.chunks, controls)
          omed = np.median(old_times[15:25])
          unhoisted, gain = f"{1e3 * omed:.1f}", f"{omed / med:.2f}x"
        joined = split_gain = "-"
        if a.concat_cache:
          with concatenated_cache():
            old_times, _ = walk(model, first, k, policy, st, a.chunks, controls)
          omed = np.median(old_times[15:25])
          joined, split_gain = f"{1e3 * omed:.1f}", f"{omed / med:.2f}x"
        print(f"| {label} | {policy} | {st} | {1e3 * med:.1f} | {chunk / med:.1f} | {1e3 * bmed:.1f} | "
              f"{med / bmed:.2f} | {1e3 * floor:.1f} | {med / floor:.2f} | {far_cell} | {ratio} | {unhoisted} | {gain} | "
              f"{joined} | {split_gain} | {peak_mib():.0f} |", flush=True)


if __name__ == "__main__":
  main()
