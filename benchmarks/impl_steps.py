"""Attention impls (and remat policies) in the training step, and jaxwm's backbone against torch's with each alone in
its own process.

  python benchmarks/impl_steps.py --configs tiny_viewrope_tf,small,recipe_w192,recipe_w384 --impls xla_lse,cpu_flash
  python benchmarks/impl_steps.py --configs tiny,recipe_w384 --impls auto --remats none,dots_and_kernels

Per config: the real train step (``train_step.jaxwm_train_step``) and the backbone step (``train_step.
jaxwm_backbone_step``: rope3d, dense attention) for each ``model.attention_impl``, the impls interleaved in one
process (best of ``--repeats``, or with ``--paired N`` the median of N rounds alternating their order,
``timing.paired``; huge pages on, as ``train.py`` runs). Then diffusers' backbone step alone in a
child process (huge pages off, torch's default): torch's step slows by up to 40% when it alternates with XLA's in
one process (both thread pools compete for the cores), so ``train_step.py``'s same-process ratio leans towards
jaxwm. An impl a config refuses (e.g. ``splash`` with WorldRoPE's per-view attention) gets its error instead.
"""

import argparse
import json
import os
import subprocess
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train_step as ts  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxwm.training.sharding import resolve_batch_size  # noqa: E402
from jaxwm.utils import hugepages  # noqa: E402
from timing import interleaved_best, paired  # noqa: E402  pylint: disable=g-import-not-at-top


def _config(name, impl=None, remat=None):
  c = ts.CONFIGS[name]()
  resolve_batch_size(c, 1)
  if impl is not None:
    c.model.attention_impl = impl
  if remat is not None:
    c.model.remat = remat
  return c


def _variant(v):
  """``"impl"`` or ``"impl/remat"`` -> ``(impl, remat or None)``."""
  impl, _, remat = v.partition("/")
  return impl, remat or None


def _real(name, v):
  impl, remat = _variant(v)
  tr, state, batch, key = ts.jaxwm_train_step(_config(name, impl, remat),
                                              f"/tmp/jaxwm_impl_steps_{name}_{v.replace('/', '_')}")
  box = [state]

  def run():
    box[0], m = tr.train_step(box[0], batch, key)
    jax.block_until_ready(m)

  return run


def _backbone(name, v):
  step, args, _ = ts.jaxwm_backbone_step(_config(name, *_variant(v)))
  box = [args]

  def run():
    state, loss = step(*box[0])
    box[0] = (state, *box[0][1:])
    jax.block_until_ready(loss)

  return run


def torch_alone(name, repeats):
  """Best seconds of diffusers' backbone step for ``name`` in a fresh process without huge pages."""
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env["JAXWM_HUGEPAGES"] = "0"
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-only", name, "--repeats", str(repeats)],
                       env=env, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default="tiny_viewrope_tf,small,recipe_w192,recipe_w384")
  p.add_argument("--impls", default="xla_lse,cpu_flash")
  p.add_argument("--remats", default="", help="comma-separated model.remat policies: one column per impl and policy "
                 "(default: the config's)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--paired", type=int, default=0, help="jaxwm's steps: the median of this many alternated rounds "
                 "(timing.paired) instead of the best of --repeats")
  p.add_argument("--torch-only", default=None, help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.repeats < 1:
    p.error(f"--repeats: {a.repeats} is not a positive integer")
  if a.paired < 0:
    p.error(f"--paired: {a.paired} is not a non-negative integer")
  if a.torch_only:
    step, _ = ts.torch_step(_config(a.torch_only), os.cpu_count())
    print(json.dumps({"s": interleaved_best({"torch": step}, a.repeats)["torch"]}))
    return
  hugepages.reexec()
  names, impls = a.configs.split(","), a.impls.split(",")
  bad = [n for n in names if n not in ts.CONFIGS]
  if bad:
    p.error(f"--configs: {bad} not among {sorted(ts.CONFIGS)}")
  from jaxwm.kernels import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import REMAT_POLICIES  # pylint: disable=g-import-not-at-top
  if any(i not in ATTENTION_IMPLS for i in impls):
    p.error(f"--impls: {impls} not all among {ATTENTION_IMPLS}")
  remats = [r for r in a.remats.split(",") if r]
  if any(r not in REMAT_POLICIES for r in remats):
    p.error(f"--remats: {remats} not all among {REMAT_POLICIES}")
  impls = [f"{i}/{r}" for i in impls for r in remats] if remats else impls
  how = f"jaxwm: median of {a.paired} alternated rounds, torch: best of {a.repeats}" if a.paired else \
      f"best of {a.repeats}"
  print(f"{os.cpu_count()} CPU cores; {how}; huge pages for jaxwm: "
        f"{'on' if hugepages.enabled() else 'off'}; ms\n")
  print("| config | " + " | ".join(f"real step {i}" for i in impls) + " | " +
        " | ".join(f"backbone {i}" for i in impls) + " | torch backbone, alone | " +
        " | ".join(f"torch / jaxwm {i}" for i in impls) + " |")
  print("|" + " --- |" * (2 + 3 * len(impls)))
  for name in names:
    real, errors = {}, {}
    for impl in impls:
      try:
        real[impl] = _real(name, impl)
      except Exception as e:  # pylint: disable=broad-except  (a config's refusal, shown in its cell)
        errors[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    if a.paired:
      real_t = {k: v["median"] for k, v in paired(real, a.paired).items()} if real else {}
      back_t = {k: v["median"] for k, v in paired({i: _backbone(name, i) for i in impls}, a.paired).items()}
    else:
      real_t = interleaved_best(real, a.repeats) if real else {}
      back_t = interleaved_best({i: _backbone(name, i) for i in impls}, a.repeats)
    torch_t = torch_alone(name, a.repeats)
    cells = [errors.get(i) or f"{real_t[i] * 1e3:.1f}" for i in impls]
    cells += [f"{back_t[i] * 1e3:.1f}" for i in impls] + [f"{torch_t * 1e3:.1f}"]
    cells += [f"{torch_t / back_t[i]:.2f}x" for i in impls]
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
