"""WorldRoPE's factors and views: the C++ kernel against the ``jnp`` reference, and the sampler's cache views, in one run.

  python benchmarks/worldrope_speed.py                       # the tables in BENCHMARKS.md
  python benchmarks/worldrope_speed.py --parts keys --reps 50
  python benchmarks/worldrope_speed.py --parts factors,step

WorldRoPE (the default model's encoding) multiplies every key's h/w pairs by an expected rotary factor per query
view (``jaxwm.encodings.worldrope.transform_keys``). The sampler computes these views of its whole cache once per
chunk (``WorldRoPE.cache_views``). Until 2026-12-04 that was the vectorised ``transform_keys`` (the one training
differentiates) in a ``lax.map`` over layers; XLA:CPU fused its factor into the product with the keys and so
recomputed it for every head and channel, ran the 3x3 products as batched tiny dots, the sum over hypotheses as a
slow reduction and ``jnp.sin`` / ``jnp.cos`` as scalar calls. ``per_view=True`` loops over the query views with
the terms written out and ``jaxwm.ops.sincos``; ``cache_views`` vmaps it over layers.

Parts (``--parts``):
- ``factors``: ``jaxwm.kernels.view_factors`` at the default model's training shape (4 clips x 9 views x 576 keys,
  4 hypotheses, 16 pairs), forward and forward + backward (every input's gradient): the reference as training ran it
  (``jax.checkpoint``ed: its forward again in the backward) against the kernel (``impl='cpu_flash'``), interleaved,
  outputs compared.
- ``step``: the default model's real train step (``configs/tiny.py``, ``cpu_flash`` attention) with WorldRoPE's
  factors by the reference against the kernel, alternated in one process (``timing.paired``: ``2 min(--reps, 10)``
  rounds; best and median wall time, median CPU time).
- ``keys``: one layer's ``transform_keys`` three ways (the vectorised reference, its ``per_view=True`` loop, the
  factors' C++ kernel), outputs compared.
- ``viewer``: the viewer's generation path (``jaxwm.play.engine.Player`` with the randomly initialised default
  model, as ``benchmarks/play_speed.py``): median chunk time of chunks 15-25 with the ``cache_views`` of
  2026-12-04, with today's sampler but the factors in ``jnp``, and as it runs (the factors' C++ kernel), in the same
  process.
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
  """``with formulation("before"):`` the baseline's ``WorldRoPE.cache_views`` (2026-12-04, factors in ``jnp``);
  ``formulation("jnp_factors")``: today's sampler with the factors by the ``jnp`` reference instead of the C++
  kernel; ``formulation("now")``: as it runs."""

  def __init__(self, which):
    self.which = which

  def __enter__(self):
    from jaxwm import kernels  # pylint: disable=g-import-not-at-top
    jax.clear_caches()  # the programs are traced again with the patched functions
    self.saved = type(wr.ENCODING).cache_views, kernels.resolve_view_factors_impl
    if self.which == "before":
      type(wr.ENCODING).cache_views = _old_cache_views
    if self.which in ("before", "jnp_factors"):
      kernels.resolve_view_factors_impl = lambda _: "xla"
    return self

  def __exit__(self, *exc):
    from jaxwm import kernels  # pylint: disable=g-import-not-at-top
    type(wr.ENCODING).cache_views, kernels.resolve_view_factors_impl = self.saved
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
  print("| keys x views (one layer) | vectorised ms | per_view=True ms | factor kernel ms | speed-up of per_view over "
        "vectorised | speed-up of the kernel over per_view | max abs difference |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for label, (b, lk, fq) in {"576 x 2 (window cache, chunk of 2)": (1, 576, 2),
                             "1536 x 2 (landmark cache, chunk of 2)": (1, 1536, 2),
                             "4160 x 2 (full cache, 65 frames)": (1, 4160, 2)}.items():
    k, gauss, q_k, q_c2w = _keys_inputs(b, lk, fq)
    fns = {name: jax.jit(lambda k_, g_, pv=pv, impl=impl: wr.transform_keys(k_, g_, q_k, q_c2w, freqs, pairs, 4.0,
                                                                           per_view=pv, impl=impl))
           for name, pv, impl in (("vectorised", False, "xla"), ("per_view", True, "xla"),
                                  ("kernel", False, "cpu_flash"))}
    outs = {name: fn(k, gauss) for name, fn in fns.items()}
    t = {name: _median_ms(fn, (k, gauss), reps) for name, fn in fns.items()}
    diff = max(float(jnp.max(jnp.abs(outs["vectorised"] - o))) for o in outs.values())
    print(f"| {label} | {t['vectorised']:.2f} | {t['per_view']:.2f} | {t['kernel']:.2f} | "
          f"{t['vectorised'] / t['per_view']:.2f}x | {t['per_view'] / t['kernel']:.2f}x | {diff:.1e} |", flush=True)


def part_factors(reps):
  from jaxwm import kernels  # pylint: disable=g-import-not-at-top
  from timing import interleaved_best  # pylint: disable=g-import-not-at-top
  freqs = wr.hw_frequencies(48, range(8, 24))
  _, gauss, q_k, q_c2w = _keys_inputs(4, 576, 9)
  ct = jax.random.normal(jax.random.key(1), (4, 9, 576, 16, 2))

  def program(impl, backward):
    def f(g, k, c):
      return kernels.view_factors(g, k, c, freqs, 4.0, impl=impl)
    f = jax.checkpoint(f) if impl == "xla" else f  # as WorldRoPE.attend runs each
    if not backward:
      return jax.jit(f)
    return jax.jit(lambda g, k, c: jax.vjp(f, g, k, c)[1](ct))

  print("| 4 x 9 views x 576 keys x 4 hypotheses x 16 pairs | reference ms | kernel ms | speed-up | max abs difference |")
  print("| --- | --- | --- | --- | --- |")
  for backward in (False, True):
    fns = {impl: program(impl, backward) for impl in ("xla", "cpu_flash")}
    outs = {impl: fn(gauss, q_k, q_c2w) for impl, fn in fns.items()}
    diff = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(outs["xla"]),
                                                               jax.tree.leaves(outs["cpu_flash"])))
    t = interleaved_best({i: lambda fn=fn: jax.block_until_ready(fn(gauss, q_k, q_c2w)) for i, fn in fns.items()},
                         reps)
    label = "forward + backward (all gradients)" if backward else "forward"
    print(f"| {label} | {1e3 * t['xla']:.2f} | {1e3 * t['cpu_flash']:.2f} | {t['xla'] / t['cpu_flash']:.2f}x | "
          f"{diff:.1e} |", flush=True)


def part_step(reps):
  import train_step as ts  # pylint: disable=g-import-not-at-top
  from jaxwm import kernels  # pylint: disable=g-import-not-at-top
  from jaxwm.training.sharding import resolve_batch_size  # pylint: disable=g-import-not-at-top
  from timing import paired  # pylint: disable=g-import-not-at-top
  resolve = kernels.resolve_view_factors_impl
  fns = {}
  for impl in ("xla", "cpu_flash"):
    config = ts.CONFIGS["tiny"]()
    resolve_batch_size(config, 1)
    config.model.attention_impl = "cpu_flash"
    tr, state, batch, key = ts.jaxwm_train_step(config, f"/tmp/jaxwm_worldrope_speed_{impl}")
    box = [state]

    def run(tr=tr, box=box, batch=batch, key=key):
      box[0], m = tr.train_step(box[0], batch, key)
      jax.block_until_ready(m)

    kernels.resolve_view_factors_impl = lambda _, impl=impl: impl  # traced (and compiled) by the first call
    try:
      run()
    finally:
      kernels.resolve_view_factors_impl = resolve
    fns[impl] = run
  t = paired(fns, 2 * reps)
  print("| the default model's train step (cpu_flash attention) | factors by the reference ms | by the kernel ms | "
        "speed-up |")
  print("| --- | --- | --- | --- |")
  label = f"configs/tiny.py, batch {jax.tree.leaves(batch)[0].shape[0]}"
  for stat, what in (("min", "best wall"), ("median", "median wall"), ("cpu_median", "median CPU time")):
    x, k = 1e3 * t["xla"][stat], 1e3 * t["cpu_flash"][stat]
    print(f"| {label}: {what} | {x:.1f} | {k:.1f} | {x / k:.2f}x |", flush=True)


def part_viewer(steps, policies, chunks):
  import play_speed as ps  # pylint: disable=g-import-not-at-top
  from jaxwm.play.engine import first_frame  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.controls import Controls  # pylint: disable=g-import-not-at-top
  config = ps.load_config("tiny")
  model, _ = ps.random_model(config, 65)
  first, k = first_frame(model, 0)
  controls = Controls(speed=0.05, turn=5.0)
  print("| memory | steps | before (2026-12-04): chunk ~20 ms | frames/s | factors in jnp: chunk ~20 ms | frames/s | "
        "now (factor kernel): chunk ~20 ms | frames/s | speed-up over factors in jnp | speed-up over before |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for policy in policies:
    for st in steps:
      med = {}
      for which in ("before", "jnp_factors", "now"):
        with formulation(which):
          times, _ = ps.walk(model, first, k, policy, st, chunks, controls)
        med[which] = float(np.median(times[15:25]))
      b, j, n = med["before"], med["jnp_factors"], med["now"]
      print(f"| {policy} | {st} | {1e3 * b:.1f} | {model.chunk / b:.1f} | {1e3 * j:.1f} | {model.chunk / j:.1f} | "
            f"{1e3 * n:.1f} | {model.chunk / n:.1f} | {j / n:.2f}x | {b / n:.2f}x |", flush=True)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--parts", default="factors,step,keys,viewer", help="comma-separated: factors, step, keys, viewer")
  ap.add_argument("--reps", type=int, default=30, help="timed calls per row of the keys part")
  ap.add_argument("--steps", default="1,2,4", help="Euler steps per chunk of the viewer rows")
  ap.add_argument("--policies", default="window,landmark", help="memory policies of the viewer rows")
  ap.add_argument("--chunks", type=int, default=30, help="chunks per viewer walk (the median is over 15-25), >= 26")
  a = ap.parse_args()
  parts = a.parts.split(",")
  for p in parts:
    if p not in ("factors", "step", "keys", "viewer"):
      ap.error(f"--parts: {p!r} is not one of factors, step, keys, viewer")
  if a.chunks < 26:
    ap.error(f"--chunks={a.chunks}: must be >= 26 (the median is over chunks 15-25)")
  print(f"backend {jax.default_backend()}")
  if "factors" in parts:
    part_factors(a.reps)
  if "step" in parts:
    part_step(min(a.reps, 10))
  if "keys" in parts:
    part_keys(a.reps)
  if "viewer" in parts:
    part_viewer([int(s) for s in a.steps.split(",")], a.policies.split(","), a.chunks)


if __name__ == "__main__":
  main()
