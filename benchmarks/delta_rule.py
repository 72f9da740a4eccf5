"""Delta-rule scans: the chunked XLA form against the sequential recurrence and fla's PyTorch
``naive_chunk_kda``; FLOPs of LOCI's recurrent read against softmax attention over history.

  python benchmarks/delta_rule.py [--lengths 1024 8192] [--repeats 3]

KDA gates (per-channel decay), B = 1, H = 4, K = V = 128, chunk 64, float32 on CPU. Forward and
forward+backward (gradients of q, k, v, g, beta). fla's ``naive.py`` is loaded by file path
(no triton needed).
"""

import argparse
import importlib.util
import pathlib
import time

try:  # torch before jax: imported after XLA's CPU client has started, it can deadlock the next compile
  import torch  # pylint: disable=g-import-not-at-top
except ImportError:
  torch = None
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops import delta_rule as dr


def _fla_naive():
  spec = importlib.util.find_spec("fla")
  if spec is None or torch is None:
    return None
  path = pathlib.Path(spec.submodule_search_locations[0]) / "ops/kda/naive.py"
  mod_spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return mod


def _inputs(t, h, d, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(1, t, h, d))
  k = rng.normal(size=(1, t, h, d))
  q /= np.linalg.norm(q, axis=-1, keepdims=True)
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(1, t, h, d))
  g = -np.exp(rng.normal(size=(1, t, h, d)) - 3.0)
  beta = rng.uniform(0.1, 1.9, size=(1, t, h))
  return [x.astype(np.float32) for x in (q, k, v, g, beta)]


def _best(fn, repeats):
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def _jax_timers(fn, arrays):
  xs = [jnp.asarray(a) for a in arrays]
  fwd = jax.jit(lambda *a: fn(*a)[0])
  grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a)[0] ** 2), argnums=(0, 1, 2, 3, 4)))
  return (lambda: jax.block_until_ready(fwd(*xs))), (lambda: jax.block_until_ready(grad(*xs)))


def _torch_timers(naive, arrays):
  def fwd():
    with torch.no_grad():
      naive.naive_chunk_kda(*[torch.tensor(a) for a in arrays], chunk_size=64)

  def both():
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    o, _ = naive.naive_chunk_kda(*xs, chunk_size=64)
    (o ** 2).sum().backward()

  return fwd, both


def _flops(fn, *shapes):
  ca = jax.jit(fn).lower(*shapes).compile().cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return float(ca.get("flops", 0.0))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192])
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--dim", type=int, default=128)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args()
  naive = _fla_naive()
  h, d = a.heads, a.dim
  print(f"backend {jax.default_backend()}, H={h}, K=V={d}, chunk 64, KDA gates")
  rows = []
  for t in a.lengths:  # all JAX timings first: compiling after torch's thread pools start can hang
    arrays = _inputs(t, h, d)
    rec = _jax_timers(dr.delta_rule_recurrent, arrays)
    chk = _jax_timers(lambda *x: dr.delta_rule_chunked(*x, chunk_size=64), arrays)
    for i, name in enumerate(("forward", "fwd+bwd")):
      rows.append([t, name, _best(rec[i], a.repeats), _best(chk[i], a.repeats), float("nan")])
  mem = 7 * h * d * d  # XLA's cost analysis counts a scan body once, so the write is counted by hand
  n_tok, frames = 384, 34
  L = n_tok * 5  # one 5-frame chunk of queries
  sd = jax.ShapeDtypeStruct
  read = _flops(lambda q, s: jnp.einsum("bthk,bhkv->bthv", q, s), sd((1, L, h, d), jnp.float32),
                sd((1, h, d, d), jnp.float32)) / L
  attn = _flops(lambda q, k, v: jax.nn.dot_product_attention(q, k, v), sd((1, L, h, d), jnp.float32),
                sd((1, frames * n_tok, h, d), jnp.float32), sd((1, frames * n_tok, h, d), jnp.float32)) / L
  if naive is not None and torch is not None:
    for row in rows:
      tor = _torch_timers(naive, _inputs(row[0], h, d))
      row[4] = _best(tor[0 if row[1] == "forward" else 1], a.repeats)
  print("| T | pass | recurrent (s) | chunked XLA (s) | fla naive_chunk_kda torch (s) | recurrent / chunked | "
        "torch / chunked |\n| --- | --- | --- | --- | --- | --- | --- |")
  for t, name, tr, tc, tt in rows:
    print(f"| {t} | {name} | {tr:.3f} | {tc:.3f} | {tt:.3f} | {tr / tc:.1f}x | {tt / tc:.2f}x |")

  print(f"\nper query token, {h} heads of {d} (XLA cost analysis):\n"
        f"| operation | FLOPs/token | softmax / this |\n| --- | --- | --- |\n"
        f"| softmax attention over {frames} frames x {n_tok} tokens | {attn:,.0f} | 1.0x |\n"
        f"| recurrent read q^T S | {read:,.0f} | {attn / read:.0f}x |\n"
        f"| read + write (analytic: decay KV, k^T S 2KV, rank-1 update 2KV, read 2KV per head) | {mem:,.0f} | "
        f"{attn / mem:.0f}x |")


if __name__ == "__main__":
  main()
