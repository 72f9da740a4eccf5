"""LOCI's memory write: ``delta_rule_write`` (the write's own terms) against the chunked scan with zero queries and
zero decays (what the model called before 2026-12-05), for the op and for the LOCI arm's training step.

  python benchmarks/loci_write.py                     # the reproduction's LOCI arms, tiny and w384
  python benchmarks/loci_write.py --arms loci --steps 10           # the tiny arm only

Op: ``B = 4``, ``H = 4``, head dim 48 (the tiny model's), the tokens of one chunk's write; forward and
forward+backward (gradients of k, v, beta and the initial state), best of ``--repeats``, both forms interleaved.
Step: the real training step of ``configs/repro.py:<arm>`` on one device, a random batch, the model's write through
each form in turn (the old one patched in for its rows); seconds per step are the best of 3 rounds of ``--steps``,
rounds interleaved. The last column is the largest relative difference of the two forms' losses over the timed
steps (float rounding).
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import repro  # noqa: E402
from jaxwm import kernels  # noqa: E402
from jaxwm.ops import delta_rule as dr  # noqa: E402
from jaxwm.training.sharding import resolve_batch_size  # noqa: E402
from timing import interleaved_best  # noqa: E402  (benchmarks/timing.py)

NEW = kernels.delta_rule_write


def old_write(k, v, beta, *, initial_state=None, chunk_size=64, impl="xla", interpret=False, batch_axes=None):
  """The write as the model computed it before: the chunked scan with zero queries and decays, its state."""
  zeros = jnp.zeros_like(k)
  return kernels.delta_rule_chunked(zeros, k, v, zeros, beta, initial_state=initial_state, output_final_state=True,
                                    chunk_size=chunk_size, impl=impl, interpret=interpret, batch_axes=batch_axes)[1]


def op_rows(tokens, chunk, repeats):
  rng = np.random.default_rng(0)
  b, h, d = 4, 4, 48
  k = rng.normal(size=(b, tokens, h, d))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v, beta, s0 = rng.normal(size=(b, tokens, h, d)), rng.uniform(0.1, 1.9, (b, tokens, h)), rng.normal(size=(b, h, d, d))
  xs = [jnp.asarray(x, jnp.float32) for x in (k, v, beta, s0)]
  fns = {}
  for name, f in (("old", old_write), ("new", NEW)):
    fwd = jax.jit(lambda k, v, beta, s0, f=f: f(k, v, beta, initial_state=s0, chunk_size=chunk))
    grad = jax.jit(jax.grad(lambda k, v, beta, s0, f=f: jnp.sum(jnp.sin(f(k, v, beta, initial_state=s0,
                                                                          chunk_size=chunk))), argnums=(0, 1, 2, 3)))
    fns[f"{name} fwd"] = lambda fwd=fwd: jax.block_until_ready(fwd(*xs))
    fns[f"{name} f+b"] = lambda grad=grad: jax.block_until_ready(grad(*xs))
  return interleaved_best(fns, repeats)


def step_rows(arm, steps):
  from benchmarks.train_step import jaxwm_train_step  # pylint: disable=g-import-not-at-top
  config = repro.get_config(arm)
  resolve_batch_size(config, 1)
  runs = {}
  for name, f in (("old", old_write), ("new", NEW)):
    kernels.delta_rule_write = f  # the model looks the write up at trace time
    try:
      tr, state, batch, key = jaxwm_train_step(config, workdir=f"/tmp/jaxwm_bench_loci_{name}")
      step = tr.train_step.lower(state, batch, key).compile()
    finally:
      kernels.delta_rule_write = NEW
    state, m = step(state, batch, key)
    jax.block_until_ready(m)
    runs[name] = [step, state, batch, key, [], []]
  for _ in range(3):  # rounds interleaved
    for r in runs.values():
      step, state, batch, key, times, losses = r
      t0 = time.perf_counter()
      for _ in range(steps):
        state, m = step(state, batch, key)
        losses.append(float(m["loss"]))
      times.append((time.perf_counter() - t0) / steps)
      r[1] = state
  return {k: (min(r[4]), r[5]) for k, r in runs.items()}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--arms", default="loci;loci,w384", help="configs/repro.py arms, separated by ';'")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--repeats", type=int, default=5)
  a = p.parse_args()
  if a.steps < 1 or a.repeats < 1:
    p.error(f"--steps and --repeats must be >= 1; got {a.steps}, {a.repeats}")
  print("| write of | chunk | old fwd (ms) | new fwd (ms) | speed-up | old fwd+bwd (ms) | new fwd+bwd (ms) "
        "| speed-up |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for tokens in (128, 512):
    for chunk in (16, 64):
      r = op_rows(tokens, chunk, a.repeats)
      print(f"| {tokens} tokens | {chunk} | {r['old fwd'] * 1e3:.2f} | {r['new fwd'] * 1e3:.2f} | "
            f"{r['old fwd'] / r['new fwd']:.2f}x | {r['old f+b'] * 1e3:.2f} | {r['new f+b'] * 1e3:.2f} | "
            f"{r['old f+b'] / r['new f+b']:.2f}x |", flush=True)
  print()
  print("| arm | old step (ms) | new step (ms) | speed-up | largest loss difference, relative |")
  print("| --- | --- | --- | --- | --- |")
  for arm in a.arms.split(";"):
    res = step_rows(arm, a.steps)
    (t_old, l_old), (t_new, l_new) = res["old"], res["new"]
    diff = max(abs(x - y) / abs(x) for x, y in zip(l_old, l_new))
    print(f"| {arm} | {t_old * 1e3:.1f} | {t_new * 1e3:.1f} | {t_old / t_new:.2f}x | {diff:.1e} |", flush=True)


if __name__ == "__main__":
  main()
