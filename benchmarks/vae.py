"""Wan VAE throughput against diffusers on this CPU, and the HBM of streaming decoding at Wan2.2's real size
compiled for one TPU chip (``jaxwm.training.compile_only``; needs libtpu, no TPU):

  python benchmarks/vae.py

Part 1: frames/s of whole-clip ``encode`` (input frames) and ``decode`` (output frames), and of chunked
``decode_step`` (one latent frame per chunk, as diffusers decodes), for jaxwm (jit, float32, compile excluded)
and diffusers' ``AutoencoderKLWan`` (``torch.no_grad``, float32) with the same random weights, at a narrow
configuration of each structure (``--base_dim``, ``--size``, ``--frames``); median of ``--reps`` runs.

Part 2: ``decode_step`` of one latent frame (-> 4 frames of 480x832) at ``WanVAEConfig.wan22()`` compiled for
abstract ``--topology`` devices, on the first chip, the stream state donated: decoder weights (float32), stream state,
temporaries and total HBM (arguments + outputs - aliased + temporaries) from the compiled memory analysis, for
float32 and bfloat16 compute. Prints markdown tables.
"""

import argparse
import functools
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxwm.convert.wan_vae import diffusers_to_jaxwm  # noqa: E402
from jaxwm.models.wan_vae import WanVAE, WanVAEConfig  # noqa: E402
from jaxwm.training import compile_only  # noqa: E402

GIB = 1024.0**3


def _median_time(fn, reps):
  fn()  # warm-up (compiles)
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def cpu_rows(name, cfg, size, frames, reps):
  import torch  # pylint: disable=g-import-not-at-top
  from diffusers import AutoencoderKLWan  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  tm = AutoencoderKLWan(**cfg.to_diffusers()).float().eval()
  variables = jax.tree_util.tree_map(jnp.asarray, diffusers_to_jaxwm(tm.state_dict(), cfg))
  vae = WanVAE(cfg)
  video = np.random.default_rng(0).uniform(-1, 1, (1, frames, size, size, 3)).astype(np.float32)
  enc = jax.jit(functools.partial(vae.apply, method=WanVAE.encode))
  dec = jax.jit(functools.partial(vae.apply, method=WanVAE.decode))
  step = jax.jit(functools.partial(vae.apply, method=WanVAE.decode_step))
  z = np.asarray(enc(variables, video)[0])
  t_frames, out_frames = z.shape[1], 1 + 4 * (z.shape[1] - 1)

  init = vae.decode_init(1, *z.shape[2:4])

  def stream():
    state = init
    for i in range(t_frames):
      state, rgb = step(variables, state, z[:, i:i + 1])
    rgb.block_until_ready()

  jx = {"encode": _median_time(lambda: jax.block_until_ready(enc(variables, video)), reps),
        "decode": _median_time(lambda: jax.block_until_ready(dec(variables, z)), reps),
        "decode_step": _median_time(stream, reps)}
  tv, tz = torch.tensor(video).permute(0, 4, 1, 2, 3), torch.tensor(z).permute(0, 4, 1, 2, 3)
  with torch.no_grad():
    th = {"encode": _median_time(lambda: tm.encode(tv), reps), "decode": _median_time(lambda: tm.decode(tz), reps)}
  rows = []
  for what, n in (("encode", frames), ("decode", out_frames), ("decode_step", out_frames)):
    t = th.get(what, th["decode"])  # diffusers decodes one latent frame at a time either way
    rows.append(f"| {name} | {what} | {frames}x{size}x{size} | {n / jx[what]:.1f} | {n / t:.1f} | {t / jx[what]:.2f} |")
  return rows


def tpu_rows(topology, chunk):
  gen, chip, _ = compile_only.parse_topology(topology)
  device = compile_only.topology_devices(topology)[0]
  one = jax.sharding.SingleDeviceSharding(device)
  put = lambda tree: jax.tree_util.tree_map(  # pylint: disable=unnecessary-lambda-assignment
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), tree)
  cfg = WanVAEConfig.wan22()
  h, w = 480 // cfg.scale_factor_spatial, 832 // cfg.scale_factor_spatial
  rows = []
  for dtype in (jnp.float32, jnp.bfloat16):
    vae = WanVAE(cfg, dtype)
    params = jax.eval_shape(vae.init, jax.random.key(0), jax.ShapeDtypeStruct((1, 1, 32, 32, 3), jnp.float32))
    state = jax.eval_shape(lambda: vae.decode_init(1, h, w))  # pylint: disable=cell-var-from-loop
    state = state.replace(started=True)  # a later chunk (the first one is lighter: 4n - 3 frames)
    z = jax.ShapeDtypeStruct((1, chunk, h, w, cfg.z_dim), jnp.float32)
    t = time.time()
    step = jax.jit(functools.partial(vae.apply, method=WanVAE.decode_step), donate_argnums=1)  # state in place
    compiled = step.lower(put(params), put(state), put(z)).compile()
    secs = time.time() - t
    mem = compiled.memory_analysis()
    used = {k: params["params"][k] for k in ("post_quant_conv", "decoder")}  # jit drops the unused encoder
    weights = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(used)) / GIB
    cache = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(state)) / GIB
    arg, out, tmp = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes
    total = (arg + out - getattr(mem, "alias_size_in_bytes", 0) + tmp) / GIB
    rows.append(f"| {jnp.dtype(dtype).name} | {chunk} -> {4 * chunk} x 480x832 | {gen} ({chip.hbm_gib:g} GiB) | "
                f"{weights:.2f} | {cache:.2f} | {tmp / GIB:.2f} | {total:.2f} | {secs:.0f} |")
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--base_dim", type=int, default=16)
  p.add_argument("--size", type=int, default=64)
  p.add_argument("--frames", type=int, default=17)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--topology", default="v5p:2x2x1")
  p.add_argument("--chunk", type=int, default=1, help="latent frames per decode_step on the TPU")
  p.add_argument("--skip_cpu", action="store_true")
  p.add_argument("--skip_tpu", action="store_true")
  a = p.parse_args()
  if not a.skip_cpu:
    b = a.base_dim
    out = [f"CPU ({os.cpu_count()} cores), float32, batch 1, random weights, base_dim {b}:", "",
           "| structure | op | input | jaxwm frames/s | diffusers frames/s | speed-up |", "|" + " --- |" * 6]
    out += cpu_rows("Wan2.1", WanVAEConfig.tiny_wan21(base_dim=b, z_dim=16), a.size, a.frames, a.reps)
    out += cpu_rows("Wan2.2", WanVAEConfig.tiny_wan22(base_dim=b, decoder_base_dim=2 * b, z_dim=48, num_res_blocks=2),
                    a.size, a.frames, a.reps)
    print("\n".join(out) + "\n", flush=True)
  if not a.skip_tpu:
    out = [f"Wan2.2 VAE decode_step compiled for one chip of {a.topology} (per chip, GiB):", "",
           "| compute | latent frames -> video | chip | decoder weights | stream state | temporaries | total HBM | "
           "compile (s) |", "|" + " --- |" * 8]
    out += tpu_rows(a.topology, a.chunk)
    print("\n".join(out), flush=True)


if __name__ == "__main__":
  main()
