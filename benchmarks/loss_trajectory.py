"""Training numerics across implementations: the loss of the same training run (config, seed, data, steps) with
each ``model.attention_impl`` (or ``impl/remat``: with that ``model.remat`` too), step by step, and the largest
difference from the first one's.

  python benchmarks/loss_trajectory.py                                  # the default config, 20 steps, xla vs xla_lse
  python benchmarks/loss_trajectory.py --config recipe_w384 --steps 20 --impls xla,xla_lse
  python benchmarks/loss_trajectory.py --impls auto/none,auto/dots_and_kernels

Each run is ``jaxwm.training.loop.run`` in a fresh temporary workdir (the real loop: data, layout, optimiser),
so a difference is the implementation's alone.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_step as ts  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def losses(config_name, variant, steps):
  from jaxwm.training.loop import run  # pylint: disable=g-import-not-at-top
  config = ts.CONFIGS[config_name]()
  impl, _, remat = variant.partition("/")
  config.model.attention_impl = impl
  if remat:
    config.model.remat = remat
  config.train.num_steps = steps
  config.train.log_every = 1
  config.train.ckpt_every = steps
  config.train.sample_every = 0
  config.train.gain_every = 0
  config.data.source = "procedural"  # rendered on the fly: no dataset build
  with tempfile.TemporaryDirectory() as d:
    _, history = run(config, os.path.join(d, "run"), progress=False)
  return np.asarray(history, np.float64)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="tiny", choices=sorted(ts.CONFIGS))
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--impls", default="xla,xla_lse")
  a = p.parse_args()
  if a.steps < 1:
    p.error(f"--steps={a.steps}: must be >= 1")
  from jaxwm.kernels import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import REMAT_POLICIES  # pylint: disable=g-import-not-at-top
  impls = [i for i in a.impls.split(",") if i]
  ok = lambda v: v.partition("/")[0] in ATTENTION_IMPLS and v.partition("/")[2] in ("", *REMAT_POLICIES)  # pylint: disable=unnecessary-lambda-assignment
  if len(impls) < 2 or not all(map(ok, impls)):
    p.error(f"--impls={a.impls!r}: two or more of {ATTENTION_IMPLS}, each optionally '/<remat>' of {REMAT_POLICIES}")
  runs = {i: losses(a.config, i, a.steps) for i in impls}
  ref = runs[impls[0]]
  print(f"{a.config}, {a.steps} steps; loss per step:")
  print(json.dumps({i: [round(float(x), 7) for x in r] for i, r in runs.items()}))
  for i in impls[1:]:
    diff = np.abs(runs[i] - ref)
    print(f"{i} vs {impls[0]}: max |loss difference| {diff.max():.3e} (relative {np.max(diff / np.abs(ref)):.3e}), "
          f"at step {int(diff.argmax()) + 1}; first step {diff[0]:.3e}")


if __name__ == "__main__":
  main()
