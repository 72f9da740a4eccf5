"""Training-step throughput: jaxwm's teacher-forcing step, its model FLOPs utilisation against
the measured float32 matmul rate, and the same backbone step in PyTorch with diffusers'
``WanTransformer3DModel`` (dense attention, AdamW), side by side.

  python benchmarks/train_step.py                 # tiny and small configs, CPU
  python benchmarks/train_step.py --steps 20 --configs tiny
  python benchmarks/train_step.py --configs recipe_w192,recipe_w384   # the CPU recipe's two widths
  python benchmarks/train_step.py --configs tiny,tiny_p2              # patch 1 (the default) against patch 2
  python benchmarks/train_step.py --configs tiny_viewrope_tf,tiny_worldrope_tf,tiny_viewrope_df,tiny --steps 3
  python benchmarks/train_step.py --configs tiny,recipe_w384 --attention-impls xla,xla_lse   # one row per impl
  python benchmarks/train_step.py --configs tiny,recipe_w192 --remat none,full,dots_saveable   # one row per policy

Model FLOPs come from XLA's cost analysis of the compiled step (forward, backward, update). The backbone's FLOPs
(the same model and shapes in both libraries) give jaxwm's and torch's backbone MFU against the same matmul rate.
The script restarts once with huge pages for ``malloc``, as ``train.py`` does (:mod:`jaxwm.utils.hugepages`);
``JAXWM_HUGEPAGES=0`` runs it without. Torch's step runs alone in a child process with its default allocator
(:func:`bench_torch_alone`; until 2026-12-05 it shared jaxwm's process, which slowed it). ``faults/step``: minor
page faults per jaxwm step.
"""

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import encodings, recipe_cpu, small, tiny  # noqa: E402
from jaxwm.training.sharding import resolve_batch_size  # noqa: E402
from jaxwm.models.config import ModelConfig  # noqa: E402
from jaxwm.models.transformer import WanModel  # noqa: E402
from jaxwm.training import sharding as sh  # noqa: E402
from jaxwm.utils import hugepages  # noqa: E402


def matmul_rate(n=2048, repeats=10):
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  t = time.perf_counter()
  for _ in range(repeats):
    a = f(a) * 1e-3
  a.block_until_ready()
  return 2 * n**3 * repeats / (time.perf_counter() - t)


def jaxwm_train_step(config, workdir="/tmp/jaxwm_bench"):
  """``(trainer, state, batch, key)``: the real train step's pieces on one device, a random batch."""
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top  (grain: not needed by the backbone)
  tr = Trainer(config, workdir, mesh=sh.make_mesh(1, 1, jax.devices()[:1]))
  state = tr.init_state()
  rng = np.random.default_rng(0)
  d = config.data
  batch = tr.put_batch({
      "frames": rng.integers(0, 256, (d.batch_size, d.num_frames, d.image_size, d.image_size, 3), dtype=np.uint8),
      "c2w": np.tile(np.eye(4, dtype=np.float32), (d.batch_size, d.num_frames, 1, 1)),
      "intrinsics": np.tile(np.eye(3, dtype=np.float32), (d.batch_size, d.num_frames, 1, 1))})
  return tr, state, batch, jax.random.key(0)


def _xla_flops(config):
  """XLA's count of the real step's FLOPs (counted as :func:`_counted` says)."""
  tr, state, batch, key = jaxwm_train_step(_counted(config))
  return _compiled_flops(tr.train_step, state, batch, key)


def _compiled_flops(fn, *args):
  """XLA's cost-analysis FLOPs of jitted ``fn`` compiled for ``args``."""
  cost = fn.lower(*args).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def _counted(config):
  """``config`` as XLA's cost analysis can count it: a C++ kernel (``cpu_flash``, and ``auto``, which picks it on
  CPU) is opaque to it, so ``xla_lse`` takes its place (the same arithmetic); under ``remat="dots_and_kernels"``
  that ``jnp`` attention would be recomputed where the kernel's is kept, so ``remat="none"``, which computes what
  the kernel's step computes (less its recomputed elementwise work)."""
  if config.model.attention_impl in ("cpu_flash", "auto"):
    config = config.copy_and_resolve_references()
    config.model.attention_impl = "xla_lse"
    if config.model.remat == "dots_and_kernels":
      config.model.remat = "none"
  return config


def backbone_flops(config):
  """XLA's count of the backbone step's FLOPs (:func:`jaxwm_backbone_step`, counted as :func:`_counted` says):
  the work of torch's step too, which runs the same model at the same shapes."""
  step, args, _ = jaxwm_backbone_step(_counted(config))
  return _compiled_flops(step, *args)


def bench_jaxwm(config, steps):
  """The real train step (the config's layout, mask and encoding, AdamW) on one device: ``(seconds per step,
  tokens per step, XLA-counted FLOPs per step, minor page faults per step, matmul rate)``. The rate (FLOP/s,
  :func:`matmul_rate`) is the mean of one measurement right before and one right after the timed steps: this VM's
  speed drifts by tens of percent within minutes, so an MFU needs the rate of the same moment."""
  flops = _xla_flops(config)
  tr, state, batch, key = jaxwm_train_step(config)
  state, m = tr.train_step(state, batch, key)
  jax.block_until_ready(m)
  rate = matmul_rate()
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  t = time.perf_counter()
  for _ in range(steps):
    state, m = tr.train_step(state, batch, key)
  jax.block_until_ready(m)
  dt = (time.perf_counter() - t) / steps
  faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
  return dt, tr.tokens_per_step, flops, faults, (rate + matmul_rate()) / 2


def _backbone_shapes(config):
  d = config.data
  if d.batch_size < 1:
    raise ValueError(f"data.batch_size={d.batch_size}: resolve it first (resolve_batch_size(config, 1), as main() "
                     "does); 0 means per_device_batch_size per device")
  lat = d.image_size // d.latent_stride
  seq = 2 * d.num_frames - 1 - config.recipe.chunk_size  # clean + noisy frames of the layout
  return d.batch_size, seq, lat, 3 * d.latent_stride**2


def backbone_program(model, b, s, lat_hw, ch, text_len=1):
  """``(step, init, inputs)`` of the backbone's AdamW step on ``[b, s, *lat_hw, ch]`` latents with a
  ``text_len``-token context, per-token timesteps (as diffusers' Wan2.2), rope3d, dense attention by
  ``model["attention_impl"]``; ``model``: a ``model`` config dict (its dtype and remat are kept).

  ``step(state, x, t, ctx) -> (state, loss)`` is jitted and donates ``state = (params, adam state)``;
  ``init(key) -> state``; ``inputs``: the ``ShapeDtypeStruct`` of ``x, t, ctx``.
  """
  cfg = ModelConfig.from_dict({**model, "cross_attn": True, "camera": {"encoding": "rope3d"}})
  net = WanModel(cfg)
  n_tok = s * (lat_hw[0] // cfg.patch_size[1]) * (lat_hw[1] // cfg.patch_size[2])
  inputs = tuple(jax.ShapeDtypeStruct(shape, jnp.float32)
                 for shape in ((b, s, *lat_hw, ch), (b, n_tok), (b, text_len, cfg.text_dim)))
  tx = optax.adamw(1e-4)

  def init(key):  # on one frame and one context token: the parameters do not depend on the lengths
    from flax import linen as nn  # pylint: disable=g-import-not-at-top
    per_frame = n_tok // s
    x, t, ctx = jnp.zeros((b, 1, *lat_hw, ch)), jnp.zeros((b, per_frame)), jnp.zeros((b, 1, cfg.text_dim))
    params = nn.unbox(net.init(key, x, t, context=ctx))
    return params, tx.init(params)

  @functools.partial(jax.jit, donate_argnums=0)  # the state in place (a 5B state is 60 GB)
  def step(state, x, t, ctx):
    p, o = state
    def loss(p):
      return jnp.mean(jnp.square(net.apply(p, x, t, context=ctx)[0] - x))
    value, g = jax.value_and_grad(loss)(p)
    u, o = tx.update(g, o, p)
    return (optax.apply_updates(p, u), o), value

  return step, init, inputs


def backbone_step(model, b, s, lat_hw, ch, text_len=1):
  """``(step, args, tokens)``: :func:`backbone_program`'s step, its arguments (a fresh state and random inputs;
  timesteps in 0..1000) and the tokens it processes."""
  step, init, (xs, ts, cs) = backbone_program(model, b, s, lat_hw, ch, text_len)
  x = jax.random.normal(jax.random.key(0), xs.shape)
  t = jax.random.uniform(jax.random.key(1), ts.shape) * 1000
  ctx = jax.random.normal(jax.random.key(2), cs.shape)
  return step, (jax.jit(init)(jax.random.key(0)), x, t, ctx), ts.size


def jaxwm_backbone_step(config):
  """:func:`backbone_step` at the shapes and work of :func:`torch_step` for ``config`` (1-token context)."""
  b, s, lat, ch = _backbone_shapes(config)
  return backbone_step(dict(config.model), b, s, (lat, lat), ch)


def bench_jaxwm_backbone(config, steps):
  """Backbone only (:func:`jaxwm_backbone_step`): seconds per step and tokens."""
  step, (state, *inputs), tokens = jaxwm_backbone_step(config)
  state, _ = step(state, *inputs)
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, _ = step(state, *inputs)
  jax.block_until_ready(state)
  return (time.perf_counter() - t0) / steps, tokens


def torch_backbone_step(model, b, s, lat_hw, ch, text_len=1, device="cpu", bf16=False, checkpointing=False):
  """``(step, tokens)``: one AdamW step of diffusers' ``WanTransformer3DModel`` with ``model``'s shape (float32
  parameters; ``bf16``: under ``torch.autocast``; ``checkpointing``: diffusers' gradient checkpointing) at
  :func:`backbone_step`'s shapes, on ``device``: a closure over the model, optimiser and fixed inputs."""
  import torch  # pylint: disable=g-import-not-at-top
  from diffusers import WanTransformer3DModel  # pylint: disable=g-import-not-at-top
  m = model
  with torch.device(device):  # parameters made where they live (5B on a GPU: no 20 GB host copy)
    net = WanTransformer3DModel(patch_size=tuple(m["patch_size"]), num_attention_heads=m["num_heads"],
                                attention_head_dim=m["dim"] // m["num_heads"], in_channels=ch, out_channels=ch,
                                text_dim=m["text_dim"], freq_dim=m["freq_dim"], ffn_dim=m["ffn_dim"],
                                num_layers=m["num_layers"], cross_attn_norm=True, eps=m["eps"],
                                rope_max_seq_len=256).float()
  if checkpointing:
    net.enable_gradient_checkpointing()
  opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=torch.device(device).type == "cuda")
  x = torch.randn(b, ch, s, *lat_hw, device=device)
  n_tok = s * (lat_hw[0] // m["patch_size"][1]) * (lat_hw[1] // m["patch_size"][2])
  t = torch.rand(b, n_tok, device=device) * 1000
  ctx = torch.randn(b, text_len, m["text_dim"], device=device)

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
      out = net(hidden_states=x, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
    torch.mean((out.float() - x) ** 2).backward()
    opt.step()

  step.model = net  # for inspection (parameter counts)
  return step, b * n_tok


def torch_step(config, threads):
  """:func:`torch_backbone_step` on the CPU with ``threads`` threads at :func:`jaxwm_backbone_step`'s shapes."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  b, s, lat, ch = _backbone_shapes(config)
  return torch_backbone_step(dict(config.model), b, s, (lat, lat), ch)


def bench_torch(config, steps, threads):
  step, tokens = torch_step(config, threads)
  step()
  t0 = time.perf_counter()
  for _ in range(steps):
    step()
  return (time.perf_counter() - t0) / steps, tokens


def bench_torch_alone(name, steps, threads):
  """:func:`bench_torch` of config ``name`` in a fresh process without huge pages (torch's default): run in the
  same process as XLA's step, torch's step was up to 40% slower (both thread pools compete for the cores)."""
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env["JAXWM_HUGEPAGES"] = "0"
  cmd = [sys.executable, os.path.abspath(__file__), "--torch-only", name, "--steps", str(steps), "--torch-threads",
         str(threads)]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
  r = json.loads(out.stdout.strip().splitlines()[-1])
  return r["s"], r["tokens"]


def _tiny_patch2():
  """The tiny model as it was until 2026-12-02: 16 tokens of 8x8 pixels per frame (the baseline of patch 1)."""
  c = tiny.get_config()
  c.model.patch_size = (1, 2, 2)
  return c


def _tiny_variant(encoding, layout):
  """The default model with another camera encoding / training layout (RESULTS.md, "The default sees")."""
  def make():
    c = encodings.get_config(encoding)  # the encoding on its placement
    c.recipe.layout = layout
    return c
  return make


CONFIGS = {"tiny": tiny.get_config, "tiny_p2": _tiny_patch2, "small": small.get_config,
           "tiny_viewrope_tf": _tiny_variant("viewrope", "teacher_forcing"),  # the default until 2026-12-02
           "tiny_worldrope_tf": _tiny_variant("worldrope", "teacher_forcing"),
           "tiny_viewrope_df": _tiny_variant("viewrope", "diffusion_forcing"),
           "recipe_w192": lambda: recipe_cpu.get_config("w192"),
           "recipe_w384": lambda: recipe_cpu.get_config("w384")}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--configs", default="tiny,small")
  p.add_argument("--torch-threads", type=int, default=os.cpu_count())
  p.add_argument("--torch-only", default=None, help=argparse.SUPPRESS)
  p.add_argument("--backbone-only", default=None, help=argparse.SUPPRESS)
  p.add_argument("--attention-impls", default="",
                 help="comma-separated model.attention_impl values, one row each (default: the config's)")
  p.add_argument("--remat", default="",
                 help="comma-separated model.remat policies, one row each (default: the config's)")
  args = p.parse_args()
  if args.steps < 1:
    p.error(f"--steps: {args.steps} is not a positive integer")
  if args.torch_only:  # the child process of bench_torch_alone
    config = CONFIGS[args.torch_only]()
    resolve_batch_size(config, 1)
    dt, tokens = bench_torch(config, args.steps, args.torch_threads)
    print(json.dumps({"s": dt, "tokens": tokens}))
    return
  hugepages.reexec()
  if args.backbone_only:  # a child process of benchmarks/versus_torch.py: jaxwm's backbone step alone
    config = CONFIGS[args.backbone_only]()
    resolve_batch_size(config, 1)
    dt, tokens = bench_jaxwm_backbone(config, args.steps)
    print(json.dumps({"s": dt, "tokens": tokens}))
    return
  names = args.configs.split(",")
  for name in names:
    if name not in CONFIGS:
      p.error(f"--configs: {name!r} is not one of {sorted(CONFIGS)}")
  rate = matmul_rate()
  print(f"backend {jax.default_backend()}, {os.cpu_count()} cpus; measured float32 matmul rate at the start "
        f"{rate / 1e9:.1f} GFLOP/s (2048^3; each row's MFU uses its own); huge pages for malloc: "
        f"{'on' if hugepages.enabled() else 'off'}")
  from jaxwm.kernels import ATTENTION_IMPLS  # pylint: disable=g-import-not-at-top
  impls = [i for i in args.attention_impls.split(",") if i]
  bad = [i for i in impls if i not in ATTENTION_IMPLS]
  if bad:
    p.error(f"--attention-impls: {bad} not among {ATTENTION_IMPLS}")
  from jaxwm.models.config import REMAT_POLICIES  # pylint: disable=g-import-not-at-top
  remats = [r for r in args.remat.split(",") if r]
  bad = [r for r in remats if r not in REMAT_POLICIES]
  if bad:
    p.error(f"--remat: {bad} not among {REMAT_POLICIES}")
  width = max(len(n) + sum(len(x) + 2 for x in (max(impls, key=len, default=""), max(remats, key=len, default=""))
                           if x) for n in names)
  print(f"{'config':>{width}} {'params':>8} {'step ms':>8} {'tokens/s':>9} {'GFLOP/step':>10} {'MFU':>6} "
        f"{'GFLOP/s':>7} | {'backbone ms (jax)':>17} {'tok/s':>7} {'GFLOP':>6} {'MFU':>6} | {'torch ms':>8} "
        f"{'tok/s':>7} {'MFU':>6} {'jax/torch':>9} | {'faults/step':>11}")
  for name in names:
    torch_dt = None
    for impl, remat in [(i, r) for i in impls or [None] for r in remats or [None]]:
      config = CONFIGS[name]()
      resolve_batch_size(config, 1)  # data.batch_size=0: per_device_batch_size on the one device used here
      config.train.workdir = "/tmp/jaxwm_bench"
      if impl is not None:
        config.model.attention_impl = impl
      if remat is not None:
        config.model.remat = remat
      dt, tokens, flops, faults, row_rate = bench_jaxwm(config, args.steps)
      bdt, btok = bench_jaxwm_backbone(config, args.steps)
      bflops = backbone_flops(config)
      if torch_dt is None:  # torch once per config: the same step whatever jaxwm's impl
        torch_dt = bench_torch_alone(name, args.steps, args.torch_threads)
      tdt, ttok = torch_dt
      cfg = ModelConfig.from_dict(config.model)
      n_params = cfg.num_layers * (4 * cfg.dim**2 + 2 * cfg.dim * cfg.ffn_dim) / 1e6
      label = name + "".join(f"[{x}]" for x in (impl, remat) if x is not None)
      print(f"{label:>{width}} {n_params:>7.2f}M {dt * 1e3:>8.1f} {tokens / dt:>9.0f} {flops / 1e9:>10.2f} "
            f"{flops / dt / row_rate:>6.1%} {row_rate / 1e9:>7.1f} | {bdt * 1e3:>17.1f} {btok / bdt:>7.0f} "
            f"{bflops / 1e9:>6.2f} {bflops / bdt / row_rate:>6.1%} | {tdt * 1e3:>8.1f} {ttok / tdt:>7.0f} "
            f"{bflops / tdt / row_rate:>6.1%} {tdt / bdt:>8.2f}x | {faults:>11.0f}", flush=True)
  print("MFU = XLA-counted FLOPs of the step (cpu_flash rows: counted with xla_lse) / step time / the matmul rate "
        "measured right before and after that row's steps (GFLOP/s, their mean); the backbone's MFU, jaxwm's and "
        "torch's, is its XLA-counted FLOPs (GFLOP; the same model at the same shapes on both sides) / that side's "
        "step time / the same rate; jax/torch = torch step time / jaxwm backbone step time (> 1: jaxwm faster)")


if __name__ == "__main__":
  main()
