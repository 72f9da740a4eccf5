"""The training loop against its bare step: does the data pipeline starve the step? (issue: fast on CPU).

  python benchmarks/train_loop.py                       # the default config, 60 steps per run
  python benchmarks/train_loop.py --steps 40 --repeats 1

Three numbers in one process, on one device, with probes, samples and checkpoints off but the last one:
- ``bare``: ``Trainer.train_step`` on one fixed real batch, back to back (what the step alone costs);
- ``loop, no prefetch``: :func:`jaxwm.training.runner.run_steps` loading each batch after the previous step
  finished (the loop before 2026-12-02);
- ``loop``: the same loop loading the next batch while the step computes (the default);
- ``loop, grain's read-ahead``: the default loop reading 500 records ahead on 16 threads (grain's own default,
  the loader's before ``data.read_ahead`` existed; the default now reads 2 batches ahead).
Seconds per step are medians over the runs' log lines after the first (compilation excluded).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # noqa: E402
from jaxwm.training import sharding as sh  # noqa: E402
from jaxwm.training.loop import TrainTask  # noqa: E402
from jaxwm.training.runner import run_steps  # noqa: E402


def _config(steps, read_ahead=None):
  c = tiny.get_config()
  if read_ahead is not None:
    c.data.read_ahead = read_ahead
  c.train.update(num_steps=steps, log_every=10, ckpt_every=steps, sample_every=0, gain_every=0,
                 async_checkpoint=False)
  return c


def bare(steps):
  c = _config(steps)
  with tempfile.TemporaryDirectory() as wd:
    task = TrainTask(c, wd, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
    tr = task.trainer
    state = tr.init_state()
    batch = tr.put_batch(next(iter(tr.make_loader())))
    key = jax.random.key(0)
    with jax.set_mesh(tr.mesh):
      for _ in range(3):
        state, m = tr.train_step(state, batch, key)
      jax.block_until_ready(m)
      t = time.perf_counter()
      for _ in range(steps):
        state, m = tr.train_step(state, batch, key)
      jax.block_until_ready(m)
  return (time.perf_counter() - t) / steps


def loop(steps, prefetch, read_ahead=None):
  c = _config(steps, read_ahead)
  with tempfile.TemporaryDirectory() as wd:
    task = TrainTask(c, wd, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
    run_steps(task, progress=False, prefetch=prefetch)
    rows = [json.loads(x) for x in open(os.path.join(wd, "metrics.jsonl"), encoding="utf-8")]
  return float(np.median([1.0 / r["steps_per_s"] for r in rows[1:]]))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--repeats", type=int, default=2)
  a = p.parse_args()
  if a.steps < 30:
    p.error("--steps must be >= 30 (log lines after the first one are timed)")
  grain_default = 500 // tiny.get_config().data.per_device_batch_size  # batches of one device's records
  res = {"bare": [], "loop, no prefetch": [], "loop": [], "loop, grain's read-ahead": []}
  for _ in range(a.repeats):  # interleaved, so drift hits every row alike
    res["bare"].append(bare(a.steps))
    res["loop, no prefetch"].append(loop(a.steps, prefetch=False))
    res["loop"].append(loop(a.steps, prefetch=True))
    res["loop, grain's read-ahead"].append(loop(a.steps, prefetch=True, read_ahead=grain_default))
  b = float(np.median(res["bare"]))
  print(f"| {'run':<26} | s / step | x bare step |")
  print("| --- | --- | --- |")
  for name, v in res.items():
    s = float(np.median(v))
    print(f"| {name:<26} | {s:.3f} | {s / b:.2f} |")


if __name__ == "__main__":
  main()
