"""Wan2.2-TI2V-5B rows of ``gpu_check.py``: the backbone's training step in jaxwm and in diffusers' PyTorch on the
same GPU, and streaming at 480x832.

  python benchmarks/gpu_5b.py                  # the three rows alone (gpu_check.py runs them too)
  python benchmarks/gpu_5b.py --smoke          # the same code at a tiny width on the CPU (numbers mean nothing)
  python benchmarks/gpu_5b.py --lower          # CPU host: lower the full-size jaxwm programs for CUDA, run nothing

Each row runs in its own process (``--part``), so its peak device memory is its own and neither framework's
allocator holds memory the other needs.

- ``train jaxwm`` / ``train torch``: one AdamW step of the 5B backbone (``configs/wan22_ti2v_5b.py``: 30 layers of
  width 3072, float32 parameters and moments, bfloat16 compute, every layer rematerialised; rope3d, dense
  attention by ``--attention-impl``, per-token timesteps and a 512-token umT5-width context, as diffusers' Wan2.2
  takes them) on ``--train-frames`` latent frames of 480x832 (30x52 latents, 390 tokens each). jaxwm:
  ``benchmarks/train_step.py``'s backbone step; torch: diffusers' ``WanTransformer3DModel``, ``torch.autocast``
  bfloat16, gradient checkpointing. Median step time, tokens/s, MFU (model FLOPs, ``jaxwm.training.compile_only.
  model_flops`` without the rematerialised forward, over the GPU's dense bf16 peak) and peak device memory.
- ``stream jaxwm``: :meth:`jaxwm.sampling.streaming.StreamingSampler.rollout` of the 5B model (random weights:
  cost, not quality) with the window memory, ``--stream-steps`` Euler steps per chunk of ``--stream-chunk`` latent
  frames, then the Wan2.2 VAE's streaming ``decode_step`` of each chunk (random weights, bfloat16). Median ms per
  chunk of the DiT and of the decoder, and video frames per second (4 per latent frame) with and without decoding.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root (configs/)

PARTS = ("train-jax", "train-torch", "stream")
FULL = {"lat_hw": (30, 52), "text_len": 512}  # 480x832 through Wan2.2's VAE (stride 16); umT5's 512 tokens
SMOKE = {"lat_hw": (4, 6), "text_len": 8}
# Dense bf16 TFLOP/s from NVIDIA's data sheets, matched in order against jax's / torch's device name.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4),
               ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0))


def peak_flops(device_name):
  """Dense bf16 FLOP/s of a GPU by name, or None when it is not in :data:`PEAK_TFLOPS`."""
  for key, tf in PEAK_TFLOPS:
    if key in device_name:
      return tf * 1e12
  return None


def model_dict(smoke, attention_impl):
  """The 5B backbone's ``model`` config (``--smoke``: the same structure at width 64, 2 layers)."""
  from configs import wan22_ti2v_5b  # pylint: disable=g-import-not-at-top
  m = wan22_ti2v_5b.get_config().model
  if smoke:
    m.update(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
  m.attention_impl = attention_impl
  return m


def _median_s(fn, repeats, warmup=1):
  from timing import run_times  # pylint: disable=g-import-not-at-top
  return statistics.median(run_times(fn, repeats, warmup))


def _flops(model, tokens, text_len):
  """Model FLOPs of one training step (forward + backward, no recomputation) of :func:`model_dict`'s backbone at
  ``tokens`` tokens attending densely to each other."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.training.compile_only import model_flops  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  model = {**model, "attention_impl": "xla"}  # the same FLOPs; traced without a GPU's cuDNN
  cfg = ModelConfig.from_dict({**model, "cross_attn": True, "camera": {"encoding": "rope3d"}})
  _, init, _ = ts.backbone_program(model, 1, 1, cfg.patch_size[1:], cfg.in_channels, 1)
  params, _ = jax.eval_shape(lambda: init(jax.random.key(0)))  # abstract: nothing on any device
  return 3.0 * model_flops(cfg, params["params"], tokens, tokens, context=text_len, backward=False)


def _memory(stats):
  """Peak and limit (GiB) from a jax device's ``memory_stats()`` (NaN where the backend keeps none)."""
  nan = float("nan")
  return {"peak_gib": stats.get("peak_bytes_in_use", nan) / 2**30, "limit_gib": stats.get("bytes_limit", nan) / 2**30}


def train_jax(a):
  import jax  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  shapes = SMOKE if a.smoke else FULL
  model = model_dict(a.smoke, a.attention_impl)
  step, args, tokens = ts.backbone_step(dict(model), 1, a.train_frames, shapes["lat_hw"], model.in_channels,
                                        shapes["text_len"])
  box = [args]

  def run():
    state, loss = step(*box[0])
    box[0] = (state, *box[0][1:])
    jax.block_until_ready(loss)

  t0 = time.perf_counter()
  run()  # compiles
  first = time.perf_counter() - t0
  dt = _median_s(run, a.train_repeats, warmup=0)
  dev = jax.devices()[0]
  stats = dev.memory_stats() or {}
  return {"s": dt, "tokens": tokens, "flops": _flops(model, tokens, shapes["text_len"]), "device": dev.device_kind,
          "first_s": first, **_memory(stats)}


def train_torch(a):
  import torch  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  shapes = SMOKE if a.smoke else FULL
  model = model_dict(a.smoke, a.attention_impl)
  device = "cpu" if a.smoke else "cuda"
  step, tokens = ts.torch_backbone_step(dict(model), 1, a.train_frames, shapes["lat_hw"], model.in_channels,
                                        shapes["text_len"], device=device, bf16=True, checkpointing=True)

  def run():
    step()
    if device == "cuda":
      torch.cuda.synchronize()

  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  dt = _median_s(run, a.train_repeats, warmup=0)
  cuda = device == "cuda"
  return {"s": dt, "tokens": tokens, "flops": _flops(model, tokens, shapes["text_len"]), "first_s": first,
          "device": torch.cuda.get_device_name() if cuda else "cpu",
          "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
          "limit_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else float("nan")}


def stream(a):
  import functools  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jaxwm.memory import make_policy  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.models.wan_vae import WanVAE, WanVAEConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.streaming import StreamingSampler  # pylint: disable=g-import-not-at-top
  shapes = SMOKE if a.smoke else FULL
  (lh, lw), text_len = shapes["lat_hw"], shapes["text_len"]
  model = model_dict(a.smoke, a.attention_impl)
  cfg = ModelConfig.from_dict(model)
  net = WanModel(cfg)
  ch = cfg.in_channels
  ctx = jax.random.normal(jax.random.key(2), (1, text_len, cfg.text_dim))
  variables = nn.unbox(jax.jit(lambda k: net.init(k, jnp.zeros((1, 1, lh, lw, ch)), jnp.zeros((1, 1)),
                                                  context=ctx[:, :1]))(jax.random.key(0)))
  chunk, chunks = a.stream_chunk, a.stream_chunks
  frames = 1 + chunk * chunks
  hw = (lh * 16, lw * 16)
  policy = make_policy("window", max_frames=frames, chunk_frames=chunk, image_hw=hw)
  sampler = StreamingSampler(net, variables, batch_size=1, max_frames=frames, latent_hw=(lh, lw), channels=ch,
                             num_steps=a.stream_steps, context=ctx)
  stamps, latents = [], []

  def on_chunk(c, x):
    stamps.append(time.perf_counter())
    latents.append(x)

  first = jax.random.normal(jax.random.key(1), (1, 1, lh, lw, ch))
  stamps.append(time.perf_counter())
  sampler.rollout(first, frames, chunk, jax.random.key(3), memory=policy, callback=on_chunk)
  dit = np.diff(stamps)[2:]  # the first two chunks compile
  vae_cfg = WanVAEConfig.tiny_wan22() if a.smoke else WanVAEConfig.wan22()
  vae = WanVAE(vae_cfg, dtype=jnp.bfloat16)
  z = jnp.zeros((1, 1, lh, lw, vae_cfg.z_dim))
  vae_vars = jax.jit(functools.partial(vae.init, method=WanVAE.decode))(jax.random.key(4), z)
  step = jax.jit(functools.partial(vae.apply, vae_vars, method=WanVAE.decode_step), donate_argnums=0)
  state, _ = step(vae.decode_init(1, lh, lw), z)  # the clip's first latent frame (its own compile)
  vae_times = []
  for i, x in enumerate(latents):
    zc = jnp.asarray(np.asarray(x)[..., :vae_cfg.z_dim], jnp.float32)
    t0 = time.perf_counter()
    state, video = step(state, zc)
    jax.block_until_ready(video)
    if i:  # the first call of this chunk length compiles
      vae_times.append(time.perf_counter() - t0)
  dev = jax.devices()[0]
  stats = dev.memory_stats() or {}
  return {"dit_s": float(np.median(dit)), "vae_s": float(statistics.median(vae_times)), "video_frames": 4 * chunk,
          "slots": policy.capacity, "device": dev.device_kind, **_memory(stats)}


def lower(a):
  """The full-size jaxwm training step, lowered for CUDA on this host (abstract shapes: nothing is allocated)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax import export  # pylint: disable=g-import-not-at-top
  import train_step as ts  # pylint: disable=g-import-not-at-top
  model = model_dict(False, a.attention_impl)
  step, init, inputs = ts.backbone_program(dict(model), 1, a.train_frames, FULL["lat_hw"], model.in_channels,
                                           FULL["text_len"])
  state = jax.eval_shape(init, jax.random.key(0))
  n = sum(x.size for x in jax.tree_util.tree_leaves(state[0]))
  exp = export.export(step, platforms=["cuda"])(state, *inputs)
  return {"parameters": n, "platforms": list(exp.platforms), "stablehlo_chars": len(exp.mlir_module())}


def _child_env(part):
  """The environment of a part's process: the jax parts may take 95% of the GPU (jax's default cap is 75%, with or
  without preallocation); the torch part keeps jax off the GPU (it only counts FLOPs)."""
  env = dict(os.environ)
  if part == "train-torch":
    env["JAX_PLATFORMS"] = "cpu"
  else:
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  return env


def _error_line(text):
  """The last line of ``text`` that names an error (else its last line), fit for a markdown cell."""
  lines = [l.strip() for l in text.strip().splitlines() if l.strip()] or ["no output"]
  named = [l for l in lines if "Error" in l or "error" in l]
  return (named or lines)[-1][:240].replace("|", "/")


def run_part(part, a):
  """Runs ``part`` in a child process (at most ``--part-timeout`` seconds); its result dict, or ``{"error": ...}``."""
  cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--train-frames", str(a.train_frames),
         "--train-repeats", str(a.train_repeats), "--stream-chunk", str(a.stream_chunk), "--stream-chunks",
         str(a.stream_chunks), "--stream-steps", str(a.stream_steps), "--attention-impl", a.attention_impl]
  cmd += ["--smoke"] if a.smoke else []
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_child_env(part),
                          timeout=a.part_timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {a.part_timeout} s (--part-timeout)"}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    return {"error": f"exit {proc.returncode}: {_error_line(proc.stderr)}"}
  return json.loads(lines[-1])


def _fmt(value, spec, unit=""):
  return "-" if value is None or value != value else f"{value:{spec}}{unit}"  # None or NaN: not measured


def _mem(r):
  """``peak of limit`` GiB, ``-`` where the device keeps no statistics (the CPU)."""
  if r["peak_gib"] != r["peak_gib"]:
    return "-"
  return f"{r['peak_gib']:.1f} of {_fmt(r['limit_gib'], '.1f')} GiB"


def tables(a):
  """Two markdown tables, yielded line by line as their rows are measured: the training step in torch and jaxwm,
  and streaming."""
  shapes = SMOKE if a.smoke else FULL
  lh, lw = shapes["lat_hw"]
  where = "width 64, 2 layers (smoke)" if a.smoke else "5B"
  yield from [f"Wan2.2-TI2V-5B backbone training step ({where}; 1 x {a.train_frames} latent frames of {lh}x{lw}, "
         f"{a.train_frames * lh * lw // 4} tokens, text {shapes['text_len']}; bf16 compute, float32 AdamW, every "
         f"layer rematerialised; jaxwm attention {a.attention_impl}; median of {a.train_repeats}):", "",
         "| framework | ms / step | tokens/s | MFU (bf16 peak) | peak device memory | first step (s) | error |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
  times = {}
  for name, part in (("diffusers (torch)", "train-torch"), ("jaxwm", "train-jax")):
    r = run_part(part, a)
    if "error" in r:
      yield f"| {name} | - | - | - | - | - | {r['error']} |"
      continue
    times[name] = r["s"]
    peak = peak_flops(r["device"])
    mfu = r["flops"] / r["s"] / peak if peak else None
    yield (f"| {name} | {r['s'] * 1e3:.1f} | {r['tokens'] / r['s']:.0f} | {_fmt(mfu, '.1%')} | "
           f"{_mem(r)} | {r['first_s']:.1f} | - |")
  if len(times) == 2:
    yield from ["", f"torch / jaxwm step time: {times['diffusers (torch)'] / times['jaxwm']:.2f}x (> 1: jaxwm "
                    "faster)"]
  yield from ["", f"Streaming ({where}, {lh * 16}x{lw * 16}, chunks of {a.stream_chunk} latent frames = "
          f"{4 * a.stream_chunk} video frames, {a.stream_steps} Euler steps, window memory; median over chunks "
          f"3-{a.stream_chunks}):", "",
          "| DiT ms / chunk | VAE decode ms / chunk | frames/s, DiT | frames/s, DiT + decode | cache slots | "
          "peak device memory | error |", "| --- | --- | --- | --- | --- | --- | --- |"]
  st = run_part("stream", a)
  if "error" in st:
    yield f"| - | - | - | - | - | - | {st['error']} |"
  else:
    n = st["video_frames"]
    yield (f"| {st['dit_s'] * 1e3:.1f} | {st['vae_s'] * 1e3:.1f} | {n / st['dit_s']:.1f} | "
           f"{n / (st['dit_s'] + st['vae_s']):.1f} | {st['slots']} | {_mem(st)} | - |")


def add_args(p):
  p.add_argument("--train-frames", type=int, default=21, help="latent frames of the training step (21: 81 frames)")
  p.add_argument("--train-repeats", type=int, default=3)
  p.add_argument("--stream-chunk", type=int, default=2, help="latent frames per streamed chunk")
  p.add_argument("--stream-chunks", type=int, default=8, help="chunks streamed (>= 3: the first two compile)")
  p.add_argument("--stream-steps", type=int, default=4)
  p.add_argument("--part-timeout", type=int, default=240, help="seconds each 5B row's process may run")
  p.add_argument("--attention-impl", default=None,
                 help="jaxwm's model.attention_impl for the 5B rows (default: cudnn; xla_lse with --smoke or --lower)")


def resolve(a, error):
  """Checks the 5B rows' arguments (``error(message)`` exits, as ``ArgumentParser.error``) and fills the defaults
  that depend on ``--smoke`` / ``--lower`` (arguments ``gpu_check.py`` may not have)."""
  if a.stream_chunks < 3:
    error(f"--stream-chunks: {a.stream_chunks}; needs >= 3 (the first two chunks compile and are not timed)")
  for name in ("train_frames", "train_repeats", "stream_chunk", "stream_steps", "part_timeout"):
    if getattr(a, name) < 1:
      error(f"--{name.replace('_', '-')}: {getattr(a, name)} is not a positive integer")
  if a.attention_impl is None:  # jax traces cuDNN attention only where it finds cuDNN, so not for --lower here
    a.attention_impl = "xla_lse" if getattr(a, "smoke", False) or getattr(a, "lower", False) else "cudnn"


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_args(p)
  p.add_argument("--part", choices=PARTS)
  p.add_argument("--smoke", action="store_true")
  p.add_argument("--lower", action="store_true")
  a = p.parse_args()
  resolve(a, p.error)
  if a.part:
    print(json.dumps({"train-jax": train_jax, "train-torch": train_torch, "stream": stream}[a.part](a)))
    return
  if a.lower:
    print(json.dumps(lower(a)))
    return
  for line in tables(a):
    print(line, flush=True)


if __name__ == "__main__":
  main()
