"""Frame-sparse attention (ViewRope Eq. 12) against dense chunk-causal attention.

  python benchmarks/frame_sparse.py [--max-gib 3] [--repeats 3]

All ``F`` latent frames are queries in chunks of ``--chunk`` frames (the teacher-forcing
situation); each query frame attends to its own chunk plus ``top_k`` selected history frames.
FLOPs come from XLA's cost analysis of the compiled call (compiling allocates nothing, so
every shape is reported); CPU time is measured where the call's largest buffers fit in
``--max-gib``. ``ideal`` is ``(top_k + chunk) / F``. On a GPU the script also times the
Pallas GPU kernel against ``jax.nn.dot_product_attention`` with cuDNN.
"""

import argparse
import time

import jax
import jax.numpy as jnp

from jaxwm import kernels
from jaxwm.ops.attention import expand_frame_mask
from jaxwm.ops import frame_sparse as fs
from jaxwm.ops.attention import dot_product_attention

FRAMES = (16, 51, 201)
TOKENS = {"tiny (16)": 16, "480x832 (390)": 390}


def chunk_layout(f, chunk):
  """Frame 0 alone, then chunks: ``(mask [1, F, F], local [1, F, chunk], history [1, F, F])``."""
  ids = jnp.where(jnp.arange(f) == 0, 0, 1 + (jnp.arange(f) - 1) // chunk)
  mask = (ids[None, :] <= ids[:, None])[None]
  same = ids[None, :] == ids[:, None]
  local = jnp.where(same, jnp.arange(f)[None, :], f + 1)
  local = jnp.sort(local, axis=-1)[:, :chunk]
  local = jnp.where(local > f, -1, local)[None].astype(jnp.int32)
  return mask, local, mask & ~same[None]


def _cost(fn, *args):
  compiled = jax.jit(fn).lower(*args).compile()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return compiled, float(ca.get("flops", 0.0))


def _time(compiled, args, repeats):
  jax.block_until_ready(compiled(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=48)
  p.add_argument("--top-k", type=int, default=5)
  p.add_argument("--chunk", type=int, default=3)
  p.add_argument("--samples", type=int, default=10)
  p.add_argument("--max-gib", type=float, default=3.0)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args()
  h, d, k_top, c = a.heads, a.head_dim, a.top_k, a.chunk
  gpu = jax.default_backend() == "gpu"
  print(f"backend {jax.default_backend()}, {h} heads x {d}, top_k {k_top}, chunk {c}, K_s {a.samples}")
  cols = ["tokens/frame", "F", "ideal", "FLOP sparse/dense", "dense GFLOP", "sparse GFLOP", "select GFLOP",
          "dense ms", "sparse ms", "select ms", "time sparse/dense"]
  if gpu:
    cols += ["cuDNN ms", "pallas_gpu ms"]
  print("| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
  for tname, n in TOKENS.items():
    for f in FRAMES:
      mask, local, hist = chunk_layout(f, c)
      shape = (1, f * n, h, d)
      q, k, v = (jax.ShapeDtypeStruct(shape, jnp.float32) for _ in range(3))

      def dense(q, k, v):
        return dot_product_attention(q, k, v, expand_frame_mask(mask, n))

      def sparse(q, k, v):
        return fs.frame_sparse_attention(q, k, v, tokens_per_frame=n, history=hist, local_idx=local, top_k=k_top,
                                         num_samples=a.samples)[0]

      def select(q, k):
        pos = fs.sample_positions(None, n, a.samples)
        return fs.select_frames(fs.frame_scores(q, k, n, pos), hist, k_top)

      cd, fd = _cost(dense, q, k, v)
      cs, fsp = _cost(sparse, q, k, v)
      csel, fsel = _cost(select, q, k)
      ideal = min(1.0, (k_top + c) / f)
      row = [tname, f, f"{ideal:.3f}", f"{fsp / fd:.3f}", f"{fd / 1e9:.2f}", f"{fsp / 1e9:.2f}", f"{fsel / 1e9:.4f}"]
      dense_gib = 4 * h * (f * n) ** 2 * 4 / 2**30  # mask, logits and probabilities
      sparse_gib = 3 * 4 * h * f * n * (k_top + c) * n / 2**30
      keys = jax.random.split(jax.random.key(0), 3)
      args = None
      if min(dense_gib, sparse_gib) <= a.max_gib:
        args = [jax.random.normal(kk, shape) for kk in keys]
      td = _time(cd, args, a.repeats) if args and dense_gib <= a.max_gib else None
      ts = _time(cs, args, a.repeats) if args and sparse_gib <= a.max_gib else None
      tsel = _time(csel, args[:2], a.repeats) if args else None
      fmt = lambda t: "-" if t is None else f"{1e3 * t:.1f}"
      row += [fmt(td), fmt(ts), fmt(tsel), "-" if td is None or ts is None else f"{ts / td:.3f}"]
      if gpu and args:
        qb, kb, vb = (x.astype(jnp.bfloat16) for x in args)
        tok = expand_frame_mask(mask, n)[:, None]
        cud = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=tok, implementation="cudnn"))
        idx = jnp.concatenate([local, select(*args[:2])], -1)
        ker = jax.jit(lambda q, k, v: kernels.gathered_attention(q, k, v, idx, tokens_per_frame=n, impl="pallas_gpu"))
        row += [fmt(_time(cud.lower(qb, kb, vb).compile(), (qb, kb, vb), a.repeats)),
                fmt(_time(ker.lower(qb, kb, vb).compile(), (qb, kb, vb), a.repeats))]
      print("| " + " | ".join(str(x) for x in row) + " |", flush=True)


if __name__ == "__main__":
  main()
