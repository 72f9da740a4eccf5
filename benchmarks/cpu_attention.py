"""``model.attention_impl="cpu_flash"`` (``xla_kernels/cpu_attention.cc``, one C++ kernel for XLA:CPU) against
``xla_lse`` and torch's flash attention for CPU, attention alone.

  python benchmarks/cpu_attention.py                        # the default's and the width-384 recipe's shapes
  python benchmarks/cpu_attention.py --shapes 4x960x4x48 --block 32

Per shape ``B x T x H x D`` (float32, no mask): the largest relative error of the output and of the gradients of
``q, k, v`` against ``xla_lse`` (``jaxwm.kernels.dot_product_attention``), then the best of ``--repeats``
interleaved times of the forward and of forward + backward (``jax.value_and_grad`` of a weighted sum) for the
kernel, ``xla_lse`` and torch's ``scaled_dot_product_attention`` (2 threads). ``--block``: the kernel's queries per
forward unit (``xla_kernels.cpu_attention.BLOCK``).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxwm import kernels  # noqa: E402
from timing import interleaved_best  # noqa: E402  pylint: disable=g-import-not-at-top
from xla_kernels import cpu_attention  # noqa: E402


def _rel(a, b):
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def measure(shape, block, repeats):
  import torch  # pylint: disable=g-import-not-at-top
  b, t, h, d = shape
  q, k, v, w = (jax.random.normal(jax.random.key(i), shape) for i in range(4))
  cpu_attention.BLOCK = block
  impls = {"kernel": lambda q, k, v: kernels.dot_product_attention(q, k, v, None, impl="cpu_flash"),
           "xla_lse": lambda q, k, v: kernels.dot_product_attention(q, k, v, None, impl="xla_lse")}
  fwd = {n: jax.jit(f) for n, f in impls.items()}
  both = {n: jax.jit(jax.value_and_grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * w), (0, 1, 2)))
          for n, f in impls.items()}
  out_err = _rel(fwd["kernel"](q, k, v), fwd["xla_lse"](q, k, v))
  grad_err = max(_rel(x, y) for x, y in zip(both["kernel"](q, k, v)[1], both["xla_lse"](q, k, v)[1]))
  tq, tk, tv = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
  tw = torch.randn(b, h, t, d)

  def torch_both():
    o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    (o * tw).sum().backward()

  def torch_fwd():
    with torch.no_grad():
      torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

  fns = {}
  for n in impls:
    fns[f"{n} fwd"] = lambda f=fwd[n]: jax.block_until_ready(f(q, k, v))
    fns[f"{n} both"] = lambda f=both[n]: jax.block_until_ready(f(q, k, v))
  fns["torch fwd"], fns["torch both"] = torch_fwd, torch_both
  best = interleaved_best(fns, repeats)
  return out_err, grad_err, {n: s * 1e3 for n, s in best.items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="4x960x4x48,4x240x8x48", help="B x T x H x D, comma-separated")
  p.add_argument("--block", type=int, default=64, help="queries per unit of the forward")
  p.add_argument("--repeats", type=int, default=8)
  a = p.parse_args()
  try:
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
  except ValueError:
    p.error(f"--shapes: {a.shapes!r} is not like 4x960x4x48,4x240x8x48")
  if any(len(s) != 4 or min(s) < 1 for s in shapes) or a.block < 1 or a.repeats < 1:
    p.error(f"--shapes {a.shapes!r} (four positive sizes each), --block {a.block}, --repeats {a.repeats}: "
            "must be positive")
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  print(f"{os.cpu_count()} CPU cores; best of {a.repeats} interleaved, ms; query block {a.block}\n")
  print("| B x T x H x D | rel. error out / grads | kernel fwd | xla_lse fwd | torch fwd | kernel fwd+bwd | "
        "xla_lse fwd+bwd | torch fwd+bwd | xla_lse / kernel (fwd+bwd) | torch / kernel (fwd+bwd) |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for shape in shapes:
    out_err, grad_err, ms = measure(shape, a.block, a.repeats)
    print(f"| {'x'.join(map(str, shape))} | {out_err:.1e} / {grad_err:.1e} | {ms['kernel fwd']:.1f} | "
          f"{ms['xla_lse fwd']:.1f} | {ms['torch fwd']:.1f} | {ms['kernel both']:.1f} | {ms['xla_lse both']:.1f} | "
          f"{ms['torch both']:.1f} | {ms['xla_lse both'] / ms['kernel both']:.2f}x | "
          f"{ms['torch both'] / ms['kernel both']:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
