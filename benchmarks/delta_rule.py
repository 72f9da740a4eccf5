"""Delta-rule scans: the C++ kernel (``impl="cpu_flash"``, chunk 16) and the chunked XLA form (chunk 16, the CPU
default, and 64) against the sequential recurrence and fla's PyTorch ``naive_chunk_kda``, and against the chunked
form's matmul FLOP floor; FLOPs of LOCI's recurrent read against softmax attention over history.

  python benchmarks/delta_rule.py [--lengths 1024 8192] [--repeats 5]

KDA gates (per-channel decay), B = 1, H = 4, K = V = 128, float32 on CPU. Forward and forward+backward
(gradients of q, k, v, g, beta). The JAX forms are timed interleaved (one call of each in turn, best of
``--repeats``): this VM's speed drifts by tens of percent within a minute. The floor is the chunked form's FLOPs
(XLA's cost analysis of the state-independent terms over all chunks, plus one state step's times the number of
chunks: cost analysis counts a scan body once) at the rate of a 1024^3 float32 matmul measured in the same run.
fla's ``naive.py`` is loaded by file path (no triton needed).
"""

import argparse
import functools
import importlib.util
import pathlib

try:  # torch before jax: imported after XLA's CPU client has started, it can deadlock the next compile
  import torch  # pylint: disable=g-import-not-at-top
except ImportError:
  torch = None
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm import kernels
from jaxwm.ops import delta_rule as dr
from timing import interleaved_best, run_times  # benchmarks/timing.py


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
  return min(run_times(fn, repeats))




def _matmul_rate(repeats):
  a = jnp.ones((1024, 1024), jnp.float32)
  mm = jax.jit(lambda x, y: x @ y)
  return 2 * 1024**3 / _best(lambda: jax.block_until_ready(mm(a, a)), repeats)


def _chunked_flops(t, h, d, chunk):
  """FLOPs of ``delta_rule_chunked`` at ``chunk``: the intra-chunk terms over all chunks + N state steps."""
  n = -(-t // chunk)
  sd = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # pylint: disable=unnecessary-lambda-assignment
  c = (n, 1, h, chunk)
  intra = _flops(functools.partial(dr._intra_chunk, sub=dr.sub_chunk(chunk)), sd(*c, d), sd(*c, d), sd(*c, d),
                 sd(*c, d), sd(*c))
  step = _flops(lambda s, *xs: dr._state_step(s, xs), sd(1, h, d, d), sd(1, h, chunk, d), sd(1, h, chunk, d),
                sd(1, h, chunk, chunk), sd(1, h, chunk, d), sd(1, h, chunk, d), sd(1, h, d))
  return intra + n * step


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
  p.add_argument("--repeats", type=int, default=5)
  a = p.parse_args()
  naive = _fla_naive()
  h, d = a.heads, a.dim
  print(f"backend {jax.default_backend()}, H={h}, K=V={d}, KDA gates")
  rate = _matmul_rate(a.repeats)
  rows = []
  for t in a.lengths:  # all JAX timings first: compiling after torch's thread pools start can hang
    arrays = _inputs(t, h, d)
    timers = {"recurrent": _jax_timers(dr.delta_rule_recurrent, arrays)}
    for c in (16, 64):
      timers[c] = _jax_timers(functools.partial(dr.delta_rule_chunked, chunk_size=c), arrays)
    timers["kernel"] = _jax_timers(functools.partial(kernels.delta_rule_chunked, chunk_size=16, impl="cpu_flash"),
                                   arrays)
    floor = _chunked_flops(t, h, d, 16) / rate
    for i, name in enumerate(("forward", "fwd+bwd")):
      best = interleaved_best({k: v[i] for k, v in timers.items()}, a.repeats if i == 0 else max(2, a.repeats // 2))
      rows.append([t, name, best["recurrent"], best[64], best[16], best["kernel"], float("nan"),
                   floor if i == 0 else float("nan")])
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
      row[6] = _best(tor[0 if row[1] == "forward" else 1], 1 if row[0] > 2048 else max(2, a.repeats // 2))
  print(f"matmul rate {rate / 1e9:.0f} GFLOP/s (1024^3 float32)")
  print("| T | pass | recurrent (s) | chunked 64 (s) | chunked 16 (s) | cpu_flash 16 (s) | "
        "fla naive_chunk_kda torch (s) | recurrent / cpu_flash | chunked 16 / cpu_flash | torch / cpu_flash | "
        "recurrent / chunked 16 | cpu_flash / floor | chunked 16 / floor |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for t, name, tr, t64, t16, tk, tt, fl in rows:
    floors = (f"{tk / fl:.1f}x | {t16 / fl:.1f}x ({fl * 1e3:.1f} ms)") if fl == fl else "- | -"
    print(f"| {t} | {name} | {tr:.4f} | {t64:.4f} | {t16:.4f} | {tk:.4f} | {tt:.3f} | {tr / tk:.2f}x | {t16 / tk:.2f}x "
          f"| {tt / tk:.2f}x | {tr / t16:.2f}x | {floors} |")

  print(f"\nper query token, {h} heads of {d} (XLA cost analysis):\n"
        f"| operation | FLOPs/token | softmax / this |\n| --- | --- | --- |\n"
        f"| softmax attention over {frames} frames x {n_tok} tokens | {attn:,.0f} | 1.0x |\n"
        f"| recurrent read q^T S | {read:,.0f} | {attn / read:.0f}x |\n"
        f"| read + write (analytic: decay KV, k^T S 2KV, rank-1 update 2KV, read 2KV per head) | {mem:,.0f} | "
        f"{attn / mem:.0f}x |")


if __name__ == "__main__":
  main()
