"""Per-chip memory of splash attention's mask paths, compiled here for abstract TPU chips (needs libtpu, no TPU).

  python benchmarks/splash_masks.py [--topology v5p:2x2x1] [--latents 49] [--tokens 240] [--heads 24] [--shared]
      [--layout teacher_forcing|diffusion_forcing] [--chunk 4]

One attention call, forward and backward (``jax.grad`` of its sum), bf16, ``D = 128``, one example per chip
(batch sharded over the chips), the ``--layout`` mask of ``--latents`` latent frames (default: teacher forcing on
ReWorld's 480p window, 49 latents: 1 clean latent + 11 clean chunks + 12 noisy chunks of 4 = 93 frames of 240
tokens, 22,320 tokens) with ReWorld's per-head windows (6 global heads of 24, the others the last 12 frames)
unless ``--shared``. Rows:

- ``token mask (traced)``: the token mask ``[1, H, L, L]`` as a traced array: splash's dynamic mask (the path
  every traced mask took before frame masks);
- ``frame mask (traced)``: :class:`jaxwm.ops.attention.FrameMask`, frame-aligned blocks (what training with
  chunk drop or head windows now passes);
- ``frame mask (static)``: the same mask known at trace time (:class:`StaticFrameMask`, host-built blocks;
  shared by the heads only, so it runs with ``--shared``);
- ``no mask``: splash's ``FullMask``, the floor.

Prints a markdown table: temporaries per chip from the compiled memory analysis, or the compiler's refusal.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jaxwm import kernels  # noqa: E402
from jaxwm.ops import attention as attn  # noqa: E402
from jaxwm.training import augment  # noqa: E402
from jaxwm.training.compile_only import topology_devices  # noqa: E402
from jaxwm.training.layout import make_layout  # noqa: E402


def layout_mask(latents, chunk, heads, shared, window=12, global_heads=6, kind="teacher_forcing"):
  """``[Hm, S, S]`` NumPy: the ``kind`` layout's mask of ``latents`` latent frames, with per-head windows unless
  ``shared`` (heads ``0 .. global_heads - 1`` global, the others the last ``window`` frames)."""
  lay = make_layout(kind, latents, chunk)
  if shared:
    return lay.mask[None]
  routing = np.arange(heads) < global_heads
  return np.asarray(augment.head_window_mask(lay.mask, lay.frame_pos, lay.frame_pos, routing, window))


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--topology", default="v5p:2x2x1")
  p.add_argument("--latents", type=int, default=49, help="latent frames of the clip (ReWorld: 1 + 12 chunks of 4)")
  p.add_argument("--chunk", type=int, default=4)
  p.add_argument("--tokens", type=int, default=240, help="tokens per frame")
  p.add_argument("--heads", type=int, default=24)
  p.add_argument("--shared", action="store_true", help="one mask for all heads (no head windows)")
  p.add_argument("--layout", default="teacher_forcing", choices=["teacher_forcing", "diffusion_forcing"])
  a = p.parse_args()
  frames = layout_mask(a.latents, a.chunk, a.heads, a.shared, kind=a.layout)
  s, n = frames.shape[-1], a.tokens
  length = s * n
  devices = topology_devices(a.topology)
  mesh = Mesh(np.asarray(devices), ("data",))
  x = jax.ShapeDtypeStruct((len(devices), length, a.heads, 128), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("data", None, None, None)))
  rows = [("token mask (traced)", "token"), ("frame mask (traced)", "frame")]
  rows += [("frame mask (static)", "static")] if a.shared else []
  rows += [("no mask", "none")]
  print(f"{a.topology}, {a.layout} in chunks of {a.chunk}, {s} frames x {n} tokens = {length} tokens, {a.heads} heads of 128, "
        f"{'shared mask' if a.shared else 'per-head windows'}, one example per chip, forward + backward, bf16\n")
  print("| mask | temporaries per chip | compile (s) |\n| --- | --- | --- |")
  for name, kind in rows:
    m = jnp.asarray(frames)[None]

    def grads(q, k, v, m, kind=kind):
      mask = {"token": lambda: attn.expand_frame_mask(m, n), "frame": lambda: attn.FrameMask(m, n),
              "static": lambda: attn.StaticFrameMask(frames[0], n), "none": lambda: None}[kind]()
      def loss(q, k, v):
        return kernels.dot_product_attention(q, k, v, mask, impl="splash", batch_axes=("data",)).astype(
            jnp.float32).sum()
      return jax.grad(loss, (0, 1, 2))(q, k, v)

    t0 = time.time()
    try:
      with jax.set_mesh(mesh):
        mspec = jax.ShapeDtypeStruct(m.shape, jnp.bool_, sharding=NamedSharding(mesh, P()))
        compiled = jax.jit(grads).lower(x, x, x, mspec).compile()
      cell = f"{compiled.memory_analysis().temp_size_in_bytes / 2**30:.2f} GiB"
    except Exception as e:  # pylint: disable=broad-except
      msg = str(e).splitlines()
      cell = "refused: " + next((l for l in msg if "RESOURCE_EXHAUSTED" in l or "memory" in l.lower()), msg[0])[:160]
    print(f"| {name} | {cell} | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
  main()
