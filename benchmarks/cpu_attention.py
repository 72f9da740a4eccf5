"""A prototype CPU attention kernel (``benchmarks/cpu_attention.cc``, C++ through the XLA FFI) against XLA's
``xla_lse`` and torch's flash attention for CPU: is a hand-written kernel the way to the issue-34 target?

  python benchmarks/cpu_attention.py                        # the default's and the width-384 recipe's shapes
  python benchmarks/cpu_attention.py --shapes 4x960x4x48 --block 32

Builds the kernel with ``g++`` (``-O3 -march=native -ffast-math -fopenmp``: fast math vectorises ``exp``; there
is no mask, so no infinities) into a temporary folder, with the products by the BLAS ``sgemm`` that scipy ships
(single-threaded; the kernel runs its (batch, head, query block) units on OpenMP threads). Per shape
``B x T x H x D`` (float32, no mask): the largest relative error of the output and of the gradients of ``q, k, v``
against ``xla_lse`` (``jaxwm.kernels.dot_product_attention``), then the best of ``--repeats`` interleaved times of
the forward and of forward + backward (``jax.value_and_grad`` of a weighted sum) for the kernel, ``xla_lse`` and
torch's ``scaled_dot_product_attention``. Not wired into jaxwm: no mask, float32 only, no sharding, no per-view
(WorldRoPE) form.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before scipy loads its OpenBLAS: one thread per kernel unit
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxwm import kernels  # noqa: E402
from timing import interleaved_best  # noqa: E402  pylint: disable=g-import-not-at-top

HERE = os.path.dirname(os.path.abspath(__file__))


def build():
  """Compiles ``cpu_attention.cc``; returns the loaded library with scipy's ``sgemm`` handed to it."""
  import scipy.linalg.cython_blas as blas  # pylint: disable=g-import-not-at-top
  out = os.path.join(tempfile.mkdtemp(prefix="jaxwm_cpu_attention_"), "libcpu_attention.so")
  subprocess.run(["g++", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-w",
                  f"-I{jax.ffi.include_dir()}", os.path.join(HERE, "cpu_attention.cc"), "-o", out], check=True)
  lib = ctypes.cdll.LoadLibrary(out)
  capsule = blas.__pyx_capi__["sgemm"]
  name = ctypes.pythonapi.PyCapsule_GetName
  name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
  pointer = ctypes.pythonapi.PyCapsule_GetPointer
  pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
  lib.set_sgemm(ctypes.c_void_p(pointer(capsule, name(capsule))))
  jax.ffi.register_ffi_target("jaxwm_proto_attn_fwd", jax.ffi.pycapsule(lib.AttnFwd), platform="cpu")
  jax.ffi.register_ffi_target("jaxwm_proto_attn_bwd", jax.ffi.pycapsule(lib.AttnBwd), platform="cpu")
  return lib


def make_attention(block):
  """``attention(q, k, v) -> [B, T, H, D]`` by the kernel, differentiable (its backward kernel)."""
  def forward(q, k, v):
    b, t, h, _ = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((b, h, t), jnp.float32))
    return jax.ffi.ffi_call("jaxwm_proto_attn_fwd", out)(q, k, v, block=np.int64(block))

  @jax.custom_vjp
  def attention(q, k, v):
    return forward(q, k, v)[0]

  def fwd(q, k, v):
    o, lse = forward(q, k, v)
    return o, (q, k, v, o, lse)

  def bwd(res, g):
    q, k, v, o, lse = res
    out = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (q, k, v))
    return tuple(jax.ffi.ffi_call("jaxwm_proto_attn_bwd", out)(q, k, v, o, lse, g, block=np.int64(block)))

  attention.defvjp(fwd, bwd)
  return attention


def _rel(a, b):
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def measure(shape, block, repeats):
  import torch  # pylint: disable=g-import-not-at-top
  b, t, h, d = shape
  q, k, v, w = (jax.random.normal(jax.random.key(i), shape) for i in range(4))
  impls = {"kernel": make_attention(block),
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
  build()
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
