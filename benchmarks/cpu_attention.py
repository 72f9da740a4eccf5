"""``model.attention_impl="cpu_flash"`` (``xla_kernels/cpu_attention.cc``, one C++ kernel for XLA:CPU) against
``xla_lse`` and torch's flash attention for CPU, attention alone.

  python benchmarks/cpu_attention.py                        # the default's and the width-384 recipe's shapes
  python benchmarks/cpu_attention.py --shapes 4x960x4x48 --block 32
  python benchmarks/cpu_attention.py --views 9 --pairs 16 --shapes 4x576x4x48   # WorldRoPE's per-view form

Per shape ``B x T x H x D`` (float32, no mask): the largest relative error of the output and of the gradients of
``q, k, v`` against ``xla_lse`` (``jaxwm.kernels.dot_product_attention``), then the best of ``--repeats``
interleaved times of the forward and of forward + backward (``jax.value_and_grad`` of a weighted sum) for the
kernel, ``xla_lse`` and torch's ``scaled_dot_product_attention`` (2 threads). ``--block``: the kernel's queries per
unit (``xla_kernels.cpu_attention.BLOCK``; by default its own choice, ``block_rows``).

``--views F --pairs P``: WorldRoPE's per-view form (``jaxwm.kernels.per_view_attention``: ``T / F`` queries per
view, ``P`` channel pairs rotated per view by random factors), gradients of ``q, k, v`` and the factors. Torch's
row is the same attention written for it: per view, the keys' pairs rotated (materialised ``[B F, H, T, D]``), then
``scaled_dot_product_attention`` of that view's queries.
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


def _torch_per_view(q, k, v, fac, pairs):
  """Torch's per-view attention: ``q [B, F N, H, D]``, ``k, v [B, T, H, D]``, ``fac [B, F, T, P, 2]`` ->
  ``[B, F N, H, D]``."""
  import torch  # pylint: disable=g-import-not-at-top
  b, lq, h, d = q.shape
  f = fac.shape[1]
  idx = torch.tensor(pairs)
  kv = k.unsqueeze(1).expand(b, f, *k.shape[1:]).clone()  # [B, F, T, H, D]
  k0, k1 = kv[..., 2 * idx], kv[..., 2 * idx + 1]
  re, im = fac[..., 0].unsqueeze(3), fac[..., 1].unsqueeze(3)  # [B, F, T, 1, P]
  kv[..., 2 * idx], kv[..., 2 * idx + 1] = k0 * re - k1 * im, k0 * im + k1 * re
  qf = q.reshape(b * f, lq // f, h, d).transpose(1, 2)
  kf = kv.reshape(b * f, -1, h, d).transpose(1, 2)
  vf = v.unsqueeze(1).expand(b, f, *v.shape[1:]).reshape(b * f, -1, h, d).transpose(1, 2)
  return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf).transpose(1, 2).reshape(b, lq, h, d)


def measure(shape, block, repeats, views=0, n_pairs=0):
  import torch  # pylint: disable=g-import-not-at-top
  b, t, h, d = shape
  q, k, v, w = (jax.random.normal(jax.random.key(i), shape) for i in range(4))
  pairs = tuple(range(d // 2 - n_pairs, d // 2))  # the last pairs (WorldRoPE's h/w channels)
  fac = jax.random.normal(jax.random.key(5), (b, views, t, n_pairs, 2)) if views else None
  cpu_attention.BLOCK = block or None

  def run(impl):
    if views:
      return lambda q, k, v, fac: kernels.per_view_attention(q, k, v, fac, pairs, scale=d**-0.5, impl=impl)
    return lambda q, k, v: kernels.dot_product_attention(q, k, v, None, impl=impl)

  args = (q, k, v) + ((fac,) if views else ())
  impls = {"kernel": run("cpu_flash"), "xla_lse": run("xla_lse")}
  fwd = {n: jax.jit(f) for n, f in impls.items()}
  both = {n: jax.jit(jax.value_and_grad(lambda *a, f=f: jnp.sum(f(*a) * w), tuple(range(len(args)))))
          for n, f in impls.items()}
  out_err = _rel(fwd["kernel"](*args), fwd["xla_lse"](*args))
  grad_err = max(_rel(x, y) for x, y in zip(both["kernel"](*args)[1], both["xla_lse"](*args)[1]))
  layout = (b, t, h, d) if views else (b, h, t, d)  # torch's own layout for its dense attention
  tq, tk, tv = (torch.randn(*layout, requires_grad=True) for _ in range(3))
  tfac = torch.randn(b, views, t, n_pairs, 2, requires_grad=True) if views else None
  tw = torch.randn(*layout)

  def torch_attention():
    if views:
      return _torch_per_view(tq, tk, tv, tfac, pairs)
    return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

  def torch_both():
    (torch_attention() * tw).sum().backward()

  def torch_fwd():
    with torch.no_grad():
      torch_attention()

  fns = {}
  for n in impls:
    fns[f"{n} fwd"] = lambda f=fwd[n]: jax.block_until_ready(f(*args))
    fns[f"{n} both"] = lambda f=both[n]: jax.block_until_ready(f(*args))
  fns["torch fwd"], fns["torch both"] = torch_fwd, torch_both
  best = interleaved_best(fns, repeats)
  return out_err, grad_err, {n: s * 1e3 for n, s in best.items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="4x960x4x48,4x240x8x48", help="B x T x H x D, comma-separated")
  p.add_argument("--block", type=int, default=0,
                 help="queries per unit (0: the kernel's own choice, cpu_attention.block_rows)")
  p.add_argument("--repeats", type=int, default=8)
  p.add_argument("--views", type=int, default=0, help="WorldRoPE's per-view form with this many query views")
  p.add_argument("--pairs", type=int, default=16, help="channel pairs rotated per view (with --views)")
  a = p.parse_args()
  try:
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
  except ValueError:
    p.error(f"--shapes: {a.shapes!r} is not like 4x960x4x48,4x240x8x48")
  if any(len(s) != 4 or min(s) < 1 for s in shapes) or a.block < 0 or a.repeats < 1:
    p.error(f"--shapes {a.shapes!r} (four positive sizes each), --block {a.block}, --repeats {a.repeats}: "
            "must be positive (--block 0: the kernel's choice)")
  if a.views < 0 or (a.views and any(s[1] % a.views or not 0 < a.pairs <= s[3] // 2 for s in shapes)):
    p.error(f"--views {a.views} must divide every T and --pairs {a.pairs} lie in 1..D/2 ({a.shapes!r})")
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  form = f"per-view: {a.views} views, {a.pairs} pairs rotated" if a.views else "dense"
  block = a.block or "block_rows(T)"
  print(f"{os.cpu_count()} CPU cores; best of {a.repeats} interleaved, ms; query block {block}; {form}\n")
  print("| B x T x H x D | rel. error out / grads | kernel fwd | xla_lse fwd | torch fwd | kernel fwd+bwd | "
        "xla_lse fwd+bwd | torch fwd+bwd | xla_lse / kernel (fwd+bwd) | torch / kernel (fwd+bwd) |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for shape in shapes:
    out_err, grad_err, ms = measure(shape, a.block, a.repeats, a.views, a.pairs if a.views else 0)
    print(f"| {'x'.join(map(str, shape))} | {out_err:.1e} / {grad_err:.1e} | {ms['kernel fwd']:.1f} | "
          f"{ms['xla_lse fwd']:.1f} | {ms['torch fwd']:.1f} | {ms['kernel both']:.1f} | {ms['xla_lse both']:.1f} | "
          f"{ms['torch both']:.1f} | {ms['xla_lse both'] / ms['kernel both']:.2f}x | "
          f"{ms['torch both'] / ms['kernel both']:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
