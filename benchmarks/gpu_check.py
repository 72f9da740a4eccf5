"""One command for a CUDA GPU: the compiled Pallas GPU (Triton) kernels against their ``jnp`` references and
against the libraries they replace, as one markdown table.

  python benchmarks/gpu_check.py [--repeats 10] [--frames 16 51]     # add 201 frames where time allows
  python benchmarks/gpu_check.py --lower      # here, no GPU: every program that lowers for CUDA without one

Rows (times: median of ``--repeats`` runs after ``--warmup`` runs, ``block_until_ready`` /
``torch.cuda.synchronize``; ``fwd+bwd`` = gradients of all float inputs):

- ``frame-sparse`` (ViewRope Eq. 12, ``impl="pallas_gpu"``) and ``delta rule`` (KDA, ``impl="pallas_gpu"``)
  against their ``jnp`` references (``impl="xla"``): time, speed-up, and the max relative error of the
  output and of every gradient (``max |a - b| / max |b|``, float32 inputs);
- frame-sparse attention (own chunk + ``--top-k`` history frames, Pallas) against dense chunk-causal
  attention with the token mask through cuDNN (``jax.nn.dot_product_attention(implementation="cudnn")``,
  what ``model.attention_impl="cudnn"`` runs) at ``--frames`` latent frames of ``--tokens`` tokens (Wan
  2.2 at 480x832: 390), Wan's 24 heads of 128, bf16;
- the Pallas delta rule against fla's Triton ``chunk_kda`` in PyTorch (when ``fla`` and CUDA torch import;
  otherwise the row says why it is skipped);
- Wan2.2-TI2V-5B (``benchmarks/gpu_5b.py``, each in its own process, run first): the backbone's training step
  (bf16, remat, one device) in jaxwm against diffusers' PyTorch step (time, tokens/s, MFU, peak memory), and
  streaming at 480x832 with 4 Euler steps (frames per second with and without the VAE's decoding).

On the lent GPU machine, whose image lacks diffusers, ml_collections and fla: ``benchmarks/gpu_wheels.sh`` here
first (BENCHMARKS.md, "Ready for the first lent GPU", gives the device command).

Without a GPU it exits at once with one line (exit status 2). A failing row prints its error and the rest
still run; every row is printed as soon as it is measured (the 5B tables first), so a run cut short keeps what
it measured. Each 5B row's process stops after ``--part-timeout`` seconds.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the 5B rows' processes need the memory

try:  # torch before jax (an XLA client started first can hang torch's thread pools; see delta_rule.py)
  import torch  # pylint: disable=g-import-not-at-top
except ImportError:
  torch = None
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gpu_5b  # noqa: E402  pylint: disable=g-import-not-at-top
from timing import run_times  # noqa: E402  pylint: disable=g-import-not-at-top


def _no_gpu():
  """None when jax sees a CUDA GPU, else the reason."""
  try:
    backend = jax.default_backend()
  except RuntimeError as e:
    return f"no jax backend ({str(e).splitlines()[0]})"
  if backend != "gpu":
    return f"jax's backend is {backend!r} (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r})"
  return None


def _median_ms(fn, repeats, warmup):
  return 1e3 * statistics.median(run_times(fn, repeats, warmup))


def _jax_timer(fn, args):
  compiled = jax.jit(fn).lower(*args).compile()
  return lambda: jax.block_until_ready(compiled(*args))


def _grads(fn, argnums):
  return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums)


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def frame_lists(f, chunk, top_k):
  """Own chunk + the latest ``top_k`` history frames per query frame (frame 0 alone, then chunks), as
  ``frame_idx [1, F, chunk + top_k]`` (-1 pads), and the dense chunk-causal frame mask ``[F, F]``."""
  ids = np.where(np.arange(f) == 0, 0, 1 + (np.arange(f) - 1) // chunk)
  idx = np.full((f, chunk + top_k), -1, np.int32)
  for i in range(f):
    own = np.flatnonzero(ids == ids[i])
    hist = np.flatnonzero(ids < ids[i])[-top_k:]
    row = np.concatenate([own, hist])
    idx[i, :len(row)] = row
  return idx[None], ids[None, :] <= ids[:, None]


SMOKE = False  # --smoke: kernels interpreted and dense attention by XLA, so the script's plumbing runs on CPU


def _frame_sparse(impl, n):
  from jaxwm import kernels  # pylint: disable=g-import-not-at-top
  return lambda q, k, v, idx: kernels.gathered_attention(q, k, v, idx, tokens_per_frame=n, impl=impl,
                                                         interpret=SMOKE)


def _delta(impl):
  from jaxwm import kernels  # pylint: disable=g-import-not-at-top
  return lambda q, k, v, g, beta: kernels.delta_rule_chunked(q, k, v, g, beta, chunk_size=64, impl=impl,
                                                             interpret=SMOKE)[0]


def _delta_inputs(t, h, d, seed=0):
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(1, t, h, d)) for _ in range(2))
  q /= np.linalg.norm(q, axis=-1, keepdims=True)
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(1, t, h, d))
  g = -np.exp(rng.normal(size=(1, t, h, d)) - 3.0)
  beta = rng.uniform(0.1, 0.9, size=(1, t, h))
  return [x.astype(np.float32) for x in (q, k, v, g, beta)]


def kernel_vs_reference(name, shape, fn_of_impl, args, argnums, a):
  """A row: the Pallas GPU kernel against the ``jnp`` reference, time and errors (forward, gradients)."""
  ref, ker = fn_of_impl("xla"), fn_of_impl("pallas_gpu")
  out_err = _rel(jax.jit(ker)(*args), jax.jit(ref)(*args))
  g_ker, g_ref = jax.jit(_grads(ker, argnums))(*args), jax.jit(_grads(ref, argnums))(*args)
  grad_err = max(_rel(x, y) for x, y in zip(g_ker, g_ref))
  rows = []
  for label, f_ref, f_ker in (("fwd", ref, ker), ("fwd+bwd", _grads(ref, argnums), _grads(ker, argnums))):
    t_ref = _median_ms(_jax_timer(f_ref, args), a.repeats, a.warmup)
    t_ker = _median_ms(_jax_timer(f_ker, args), a.repeats, a.warmup)
    rows.append([f"{name} {label}", shape, "jnp reference (xla)", "Pallas GPU", f"{t_ref:.2f}", f"{t_ker:.2f}",
                 f"{t_ref / t_ker:.2f}x", f"{out_err:.1e}", f"{grad_err:.1e}"])
  return rows


def sparse_vs_cudnn(f, a):
  n, h, d = a.tokens, a.heads, a.head_dim
  idx, frame_mask = frame_lists(f, a.chunk, a.top_k)
  length = f * n
  keys = jax.random.split(jax.random.key(f), 3)
  q, k, v = (jax.random.normal(kk, (1, length, h, d), jnp.bfloat16) for kk in keys)
  idx = jnp.asarray(idx)
  tok = jnp.repeat(jnp.repeat(jnp.asarray(frame_mask), n, 0), n, 1)[None, None]  # [1, 1, L, L] on device
  sparse = _frame_sparse("pallas_gpu", n)
  dense = lambda q, k, v, m: jax.nn.dot_product_attention(  # pylint: disable=unnecessary-lambda-assignment
      q, k, v, mask=m, implementation=None if SMOKE else "cudnn")
  rows = []
  for label, fs, fd in (("fwd", sparse, dense), ("fwd+bwd", _grads(sparse, (0, 1, 2)), _grads(dense, (0, 1, 2)))):
    t_dense = _median_ms(_jax_timer(fd, (q, k, v, tok)), a.repeats, a.warmup)
    t_sparse = _median_ms(_jax_timer(fs, (q, k, v, idx)), a.repeats, a.warmup)
    rows.append([f"frame-sparse vs dense {label}", f"F={f} x {n} tok, {h}x{d}, top-{a.top_k} + chunk {a.chunk}, bf16",
                 "cuDNN dense (mask)", "Pallas frame-sparse", f"{t_dense:.2f}", f"{t_sparse:.2f}",
                 f"{t_dense / t_sparse:.2f}x", "-", "-"])
  return rows


def delta_vs_fla(a):
  t, h, d = a.delta_len, a.delta_heads, a.delta_dim
  shape = f"T={t}, H={h}, K=V={d}, f32"
  name = "delta rule vs fla chunk_kda"
  if torch is None or not torch.cuda.is_available() or SMOKE:
    why = "torch not importable" if torch is None else "torch has no CUDA"
    return [[name, shape, "fla chunk_kda (Triton)", "Pallas GPU", "-", "-", f"skipped: {why}", "-", "-"]]
  try:
    from fla.ops.kda import chunk_kda  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return [[name, shape, "fla chunk_kda (Triton)", "Pallas GPU", "-", "-", f"skipped: {e}", "-", "-"]]
  arrays = _delta_inputs(t, h, d)
  xs = [jnp.asarray(x) for x in arrays]
  ours = _delta("pallas_gpu")
  tx = [torch.tensor(x, device="cuda") for x in arrays]

  def fla_fwd():
    with torch.no_grad():
      chunk_kda(*tx)
    torch.cuda.synchronize()

  def fla_both():
    xs_ = [x.clone().requires_grad_(True) for x in tx]
    o, _ = chunk_kda(*xs_)
    (o.float() ** 2).sum().backward()
    torch.cuda.synchronize()

  with torch.no_grad():
    o_fla, _ = chunk_kda(*tx)
  err = _rel(jax.jit(ours)(*xs), o_fla.float().cpu().numpy())
  rows = []
  for label, f_fla, f_ours in (("fwd", fla_fwd, _jax_timer(ours, xs)),
                               ("fwd+bwd", fla_both, _jax_timer(_grads(ours, tuple(range(5))), xs))):
    t_fla = _median_ms(f_fla, a.repeats, a.warmup)
    t_ours = _median_ms(f_ours, a.repeats, a.warmup)
    rows.append([f"{name} {label}", shape, "fla chunk_kda (Triton)", "Pallas GPU", f"{t_fla:.2f}", f"{t_ours:.2f}",
                 f"{t_fla / t_ours:.2f}x", f"{err:.1e} (vs fla)", "-"])
  return rows


def _guarded(name, fn, *args):
  try:
    return fn(*args)
  except Exception as e:  # pylint: disable=broad-except
    return [[name, "-", "-", "-", "-", "-", f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}", "-", "-"]]


def lowered_for_cuda(a):
  """``{program: StableHLO characters}``, nothing run: the kernel rows' programs at this run's shapes (the Pallas
  GPU kernels and their ``jnp`` references, forward and gradients) exported for CUDA for an abstract H200 (jax 0.11
  lowers Triton kernels on a host without a GPU only for a named one), and the 5B training step
  (:func:`gpu_5b.lower`). The cuDNN programs are left out: jax traces them only where it finds cuDNN."""
  from jax import export  # pylint: disable=g-import-not-at-top
  from jax.sharding import AbstractDevice, AbstractMesh  # pylint: disable=g-import-not-at-top
  h200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind="NVIDIA H200", num_cores=132,
                                                                    platform="gpu"))
  f, n, d = a.check_frames, a.tokens, a.head_dim
  q = jax.ShapeDtypeStruct((1, f * n, 4, d), jnp.float32)
  idx = jax.ShapeDtypeStruct((1, f, a.chunk + a.top_k), jnp.int32)
  x = jax.ShapeDtypeStruct((1, a.delta_len, a.delta_heads, a.delta_dim), jnp.float32)
  beta = jax.ShapeDtypeStruct((1, a.delta_len, a.delta_heads), jnp.float32)
  triton = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
  out = {}
  for impl in ("pallas_gpu", "xla"):
    for name, fn, args, argnums in (("frame-sparse", _frame_sparse(impl, n), (q, q, q, idx), (0, 1, 2)),
                                    ("delta rule", _delta(impl), (x, x, x, x, beta), tuple(range(5)))):
      for label, g in (("fwd", fn), ("fwd+bwd", _grads(fn, argnums))):
        with jax.sharding.use_abstract_mesh(h200):
          exp = export.export(jax.jit(g), platforms=["cuda"], disabled_checks=[triton])(*args)
        out[f"{name} {impl} {label}"] = len(exp.mlir_module())
  out["5B train step"] = gpu_5b.lower(a)["stablehlo_chars"]
  return out


def build_parser():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--frames", type=int, nargs="+", default=[16, 51])
  p.add_argument("--tokens", type=int, default=390, help="tokens per latent frame (Wan at 480x832: 390)")
  p.add_argument("--heads", type=int, default=24)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--top-k", type=int, default=5)
  p.add_argument("--chunk", type=int, default=2)
  p.add_argument("--check-frames", type=int, default=8, help="frames of the kernel-vs-reference frame-sparse row")
  p.add_argument("--delta-len", type=int, default=8192)
  p.add_argument("--delta-heads", type=int, default=8)
  p.add_argument("--delta-dim", type=int, default=128)
  p.add_argument("--smoke", action="store_true", help="CPU check of this script: interpreted kernels, XLA dense "
                 "attention; use with tiny shapes, the numbers mean nothing")
  p.add_argument("--skip-5b", action="store_true", help="the kernel rows only (the 5B rows: benchmarks/gpu_5b.py)")
  p.add_argument("--lower", action="store_true", help="no GPU needed: lower every program that can be lowered "
                 "for CUDA on this host (kernels for an abstract H200, the 5B step) and print their sizes")
  gpu_5b.add_args(p)
  return p


def main():
  p = build_parser()
  a = p.parse_args()
  gpu_5b.resolve(a, p.error)
  global SMOKE  # pylint: disable=global-statement
  SMOKE = a.smoke
  if a.lower:
    for name, size in lowered_for_cuda(a).items():
      print(f"{name}: lowered for CUDA, {size} characters of StableHLO", flush=True)
    return
  reason = None if a.smoke else _no_gpu()
  if reason:
    sys.stderr.write(f"gpu_check: no CUDA GPU: {reason}; run it where jax[cuda] sees a GPU\n")
    sys.exit(2)
  dev = jax.devices()[0]
  print(f"{dev.device_kind}, jax {jax.__version__}, torch {getattr(torch, '__version__', '-')}; "
        f"median of {a.repeats} after {a.warmup} warmup\n", flush=True)

  for line in [] if a.skip_5b else gpu_5b.tables(a):  # first, while this process holds no device memory
    print(line, flush=True)
  cols = ["case", "shape", "A", "B", "A ms", "B ms", "speed-up A/B", "max rel err (out)", "max rel err (grads)"]
  print("\n| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols), flush=True)

  def show(rows):
    for r in rows:
      print("| " + " | ".join(str(x) for x in r) + " |", flush=True)

  f, n, h, d = a.check_frames, a.tokens, 4, a.head_dim
  idx, _ = frame_lists(f, a.chunk, a.top_k)
  keys = jax.random.split(jax.random.key(0), 3)
  qkv = [jax.random.normal(kk, (1, f * n, h, d), jnp.float32) for kk in keys]
  show(_guarded("frame-sparse kernel", kernel_vs_reference, "frame-sparse", f"F={f} x {n} tok, {h}x{d}, f32",
                lambda impl: _frame_sparse(impl, n), (*qkv, jnp.asarray(idx)), (0, 1, 2), a))
  xs = [jnp.asarray(x) for x in _delta_inputs(a.delta_len, a.delta_heads, a.delta_dim)]
  show(_guarded("delta-rule kernel", kernel_vs_reference, "delta rule",
                f"T={a.delta_len}, H={a.delta_heads}, K=V={a.delta_dim}, f32", _delta, xs, tuple(range(5)), a))
  for frames in a.frames:
    show(_guarded(f"frame-sparse vs cuDNN F={frames}", sparse_vs_cudnn, frames, a))
  show(_guarded("delta rule vs fla", delta_vs_fla, a))


if __name__ == "__main__":
  main()
