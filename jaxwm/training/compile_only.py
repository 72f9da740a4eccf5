"""Compile-only runs for TPU topologies this machine does not have (like MaxText's ``train_compile``).

``python train.py --config ... --compile_only train --topology v5p:4x4x4`` builds the config's mesh
from the topology's abstract devices (``jax.experimental.topologies``; needs the ``libtpu`` wheel,
no TPU), ahead-of-time compiles the real sharded train step (``--compile_only sample``: the
streaming sampler's per-chunk denoising and commit on one chip) with the real XLA/Mosaic TPU
compilers and prints, per device, the argument, output, temporary and total HBM against the chip's
capacity, the FLOPs of one step from the compiled cost analysis, and a roofline lower bound of
the step time: ``max(FLOPs / peak, bytes accessed / bandwidth)``. It exits 1 when the step does not
fit in the chip's HBM.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures from Google Cloud's public TPU spec sheets."""
  hbm_gib: float
  bf16_tflops: float
  hbm_gbps: float


CHIPS = {
    "v4": Chip(32, 275, 1228),
    "v5e": Chip(16, 197, 819),
    "v5p": Chip(95, 459, 2765),
    "v6e": Chip(32, 918, 1640),
}
WHAT = ("train", "sample")


def parse_topology(topology):
  """``"v5p:4x4x4"`` -> ``("v5p", Chip, number of chips)``; ``ValueError`` naming the value otherwise."""
  gen, _, shape = str(topology).partition(":")
  if gen not in CHIPS or not shape:
    raise ValueError(f"--topology={topology!r}: expected <generation>:<shape> with generation in {tuple(CHIPS)}, "
                     "e.g. v5p:4x4x4 or v5e:2x2")
  try:
    dims = [int(x) for x in shape.split("x")]
  except ValueError:
    raise ValueError(f"--topology={topology!r}: the shape {shape!r} is not like 4x4x4") from None
  if not dims or min(dims) < 1:
    raise ValueError(f"--topology={topology!r}: the shape {shape!r} is not like 4x4x4")
  return gen, CHIPS[gen], int(np.prod(dims))


def topology_devices(topology):
  """The abstract devices of ``topology`` (compilation only: nothing runs on them)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  gen, _, _ = parse_topology(topology)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: other processes may hold libtpu
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", {"v5e": "v5litepod-4", "v6e": "v6e-4"}.get(gen, f"{gen}-8"))
  try:
    return topologies.get_topology_desc(topology, "tpu").devices
  except Exception as e:  # libtpu missing, or a shape the TPU runtime refuses
    raise ValueError(f"--topology={topology!r}: no abstract TPU devices ({str(e).splitlines()[0]}); "
                     "install libtpu with `pip install \"jax[tpu]\"` (no TPU needed)") from e


def _abstract(tree, shardings):
  return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def compile_train(config, devices):
  """AOT-compiles the sharded train step of ``config`` over ``devices``; returns ``(compiled step,
  analytic FLOPs per device)``."""
  from jaxwm.training import sharding as sh  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  mesh = sh.make_mesh(config.mesh.data, config.mesh.fsdp, devices)
  tr = Trainer(config, "/nonexistent-compile-only", mesh=mesh)
  d = config.data
  b, f, s = d.batch_size, d.num_frames, d.image_size
  batch = {"frames": jax.ShapeDtypeStruct((b, f, s, s, 3), jnp.uint8),
           "c2w": jax.ShapeDtypeStruct((b, f, 4, 4), jnp.float32),
           "intrinsics": jax.ShapeDtypeStruct((b, f, 3, 3), jnp.float32)}
  text_len = 0
  if d.source == "records":  # the loader's batch: ingested VAE latents (and text embeddings), not frames
    del batch["frames"]
    batch.update(_records_batch(config, tr.model_cfg))
    text_len = batch["text_emb"].shape[1] if "text_emb" in batch else 0
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sh.replicated(mesh))
  state = _abstract(tr.abstract_state, tr.state_shardings)
  with jax.set_mesh(mesh):
    compiled = tr.train_step.lower(state, _abstract(batch, tr.batch_shardings), key).compile()
  seq = len(tr.layout.frame_pos)
  per_frame = tr.tokens_per_step // (b * seq)
  flops = model_flops(tr.model_cfg, tr.abstract_state.params, seq * per_frame,
                      attended_keys(tr.model_cfg, seq, config.recipe.chunk_size, per_frame),
                      context=text_len, frames=seq) * b / len(devices)
  return compiled, flops


def _records_batch(config, model_cfg):
  """``latents [B, F, h, w, C]`` and with cross-attention ``text_emb [B, L, text_dim]`` in the ingested
  dataset's storage dtype; ``L`` is its empty prompt's length (``null_text_emb.npy``), else umT5's 512."""
  from jaxwm.data import records  # pylint: disable=g-import-not-at-top
  from jaxwm.data.sources import latent_geometry  # pylint: disable=g-import-not-at-top
  d = config.data
  data_dir = os.path.expanduser(d.data_dir)
  dtype = jnp.dtype((records.read_manifest(data_dir) or {}).get("settings", {}).get("dtype", "float32"))
  b, f = d.batch_size, d.num_frames
  out = {"latents": jax.ShapeDtypeStruct((b, f, *latent_geometry(d)), dtype)}
  if model_cfg.cross_attn:
    null = os.path.join(data_dir, records.NULL_TEXT)
    text_len = np.load(null, mmap_mode="r").shape[0] if os.path.isfile(null) else 512
    out["text_emb"] = jax.ShapeDtypeStruct((b, text_len, model_cfg.text_dim), dtype)
  return out


def attended_keys(model_cfg, seq_frames, chunk, tokens_per_frame):
  """Keys each layer's attention computes per query token (dense: all of them)."""
  ac = model_cfg.attention
  softmax = seq_frames
  if ac.sparse:
    softmax = min(seq_frames, chunk + (ac.top_k if ac.sparsity == "frame_topk" else ac.window))
  return [tokens_per_frame * (chunk if kind == "hybrid" else softmax) for kind in model_cfg.layer_kinds]


def compile_sample(config, devices):
  """AOT-compiles one chunk of streaming (denoising, then the commit) on the first device; returns
  ``((denoise, analytic FLOPs), (commit, analytic FLOPs))``."""
  from jax.sharding import SingleDeviceSharding  # pylint: disable=g-import-not-at-top
  from jaxwm.diffusion import flow  # pylint: disable=g-import-not-at-top
  from jaxwm.models.cache import KVCache  # pylint: disable=g-import-not-at-top
  from jaxwm.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.conditioning import Cameras  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling import streaming  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.load import abstract_params  # pylint: disable=g-import-not-at-top
  one = SingleDeviceSharding(devices[0])
  model = WanModel(ModelConfig.from_dict(config.model))
  cfg, d = model.cfg, config.data
  from jaxwm.data.sources import latent_geometry  # pylint: disable=g-import-not-at-top
  lh, lw, ch = latent_geometry(d)  # space-to-depth of rendered frames, or an ingested dataset's latents
  chunk = config.recipe.chunk_size
  n = (lh // cfg.patch_size[1]) * (lw // cfg.patch_size[2])
  put = lambda tree: jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), tree)  # pylint: disable=unnecessary-lambda-assignment
  variables = put({"params": abstract_params(model, config)})
  cache = put(jax.eval_shape(lambda: KVCache.empty(cfg, 1, d.num_frames, n, cfg.compute_dtype)))
  x = put(jax.ShapeDtypeStruct((1, chunk, lh, lw, ch), jnp.float32))
  pos = put(jax.ShapeDtypeStruct((1, chunk), jnp.float32))
  cams = put(jax.eval_shape(lambda: Cameras.identity(1, chunk)))
  ctx = put(jax.ShapeDtypeStruct((1, 1, cfg.text_dim), jnp.float32)) if cfg.cross_attn else None
  rng = put(jax.ShapeDtypeStruct((), jax.random.key(0).dtype)) if cfg.attention.sparse else None
  schedule = flow.sampling_schedule(config.sample.num_steps, config.sample.shift)
  from jaxwm.training.sharding import make_mesh  # pylint: disable=g-import-not-at-top
  with jax.set_mesh(make_mesh(1, 1, devices[:1])):  # traced for that device's platform (attention_impl="auto")
    denoise = jax.jit(streaming.denoise, static_argnames=("model", "guidance")).lower(
        model=model, variables=variables, cache=cache, noise=x, frame_pos=pos, schedule=put(schedule), context=ctx,
        guidance=1.0, cameras=cams, rng=rng).compile()
    commit = jax.jit(streaming.commit, static_argnums=(0,)).lower(model, variables, cache, x, pos, ctx, cams,
                                                                 rng).compile()
  once = model_flops(cfg, variables["params"], chunk * n, attended_keys(cfg, d.num_frames + chunk, chunk, n), context=1,
                     backward=False, frames=chunk)
  return (denoise, once * config.sample.num_steps), (commit, once)


def model_flops(model_cfg, params, tokens, keys, context=0, backward=True, frames=None):
  """Analytic FLOPs of one forward (and backward) over ``tokens`` query tokens per device.

  ``2 * (matmul parameters) * tokens`` for the dense layers (the text projection and the cross-attention
  keys/values: ``* context`` tokens instead; the timestep embedding and its modulation projection: ``* frames``,
  one per frame, or per token when ``frames`` is None), ``4 * tokens * keys_l * dim`` for the softmax attention of
  layer ``l`` (scores and values over the ``keys_l`` keys it computes: every key for dense attention, the gathered
  frames for frame-sparse attention and LOCI hybrid layers); ``keys`` is one number or one per
  layer. A backward pass costs twice a forward, and a rematerialised forward is counted once more: all of it for
  ``full`` and jax's policies, its attention for ``dots_and_kernels`` where attention is written in ``jnp``
  (``model.attention_impl`` ``xla`` / ``xla_lse``, frame-sparse ``model.attention.impl="xla"``: batched matmuls,
  recomputed; a kernel's output, ``auto`` included, is kept), nothing for ``none``.
  XLA's cost analysis counts a scanned layer's body once, so this is the number the roofline uses.
  """
  matmul = on_context = on_frames = 0
  for path, a in jax.tree_util.tree_leaves_with_path(params):
    if a.ndim >= 2:
      names = {str(getattr(k, "key", k)) for k in path}
      if "text_embedder" in names or ("attn2" in names and names & {"to_k", "to_v"}):
        on_context += int(np.prod(a.shape))
      elif "condition_embedder" in names and frames is not None:
        on_frames += int(np.prod(a.shape))
      else:
        matmul += int(np.prod(a.shape))
  keys = [keys] * model_cfg.num_layers if np.ndim(keys) == 0 else list(keys)
  attention = 4.0 * tokens * sum(keys) * model_cfg.dim
  cross = 4.0 * tokens * context * model_cfg.dim * model_cfg.num_layers if context and model_cfg.cross_attn else 0.0
  fwd = 2.0 * matmul * tokens + 2.0 * on_context * context + 2.0 * on_frames * (frames or 0) + attention + cross
  if not backward:
    return fwd
  if model_cfg.remat == "none":
    return 3.0 * fwd
  if model_cfg.remat == "dots_and_kernels":
    dense_in_jnp = model_cfg.attention_impl in ("xla", "xla_lse")  # cross-attention, and dense self-attention
    self_in_jnp = model_cfg.attention.impl == "xla" if model_cfg.attention.sparse else dense_in_jnp
    return 3.0 * fwd + (attention if self_in_jnp else 0.0) + (cross if dense_in_jnp else 0.0)
  return 4.0 * fwd


def report(compiled, chip, label, flops=None):
  """Per-device memory, FLOPs and roofline of one compiled program: ``(lines, fits)``; ``flops``: the
  analytic count (:func:`model_flops`), used instead of the compiled cost analysis when given."""
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  gib = 1024.0**3
  arg, out, tmp = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes
  alias = getattr(mem, "alias_size_in_bytes", 0)
  total = arg + out - alias + tmp + getattr(mem, "generated_code_size_in_bytes", 0)
  xla_flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  flops = xla_flops if flops is None else flops
  t_flops, t_bytes = flops / (chip.bf16_tflops * 1e12), accessed / (chip.hbm_gbps * 1e9)
  fits = total <= chip.hbm_gib * gib
  lines = [f"{label}: per device: arguments {arg / gib:.2f} GiB, outputs {out / gib:.2f} GiB (aliased "
           f"{alias / gib:.2f}), temporaries {tmp / gib:.2f} GiB, total {total / gib:.2f} GiB of {chip.hbm_gib:g} GiB "
           f"HBM -> {'fits' if fits else 'DOES NOT FIT'}",
           f"{label}: {flops / 1e12:.3f} TFLOP (analytic; XLA's cost analysis: {xla_flops / 1e12:.3f}, one scanned "
           f"layer body) and {accessed / 1e9:.2f} GB accessed per device; roofline lower bound "
           f"{max(t_flops, t_bytes) * 1e3:.2f} ms ({'compute' if t_flops >= t_bytes else 'memory'}-bound; "
           f"{chip.bf16_tflops:g} TFLOP/s bf16, {chip.hbm_gbps:g} GB/s)"]
  return lines, fits


TEXT_LEN = 512  # umT5's padded prompt length (jaxwm.text)


def stand_in_dataset(path, data, frame_hw, text_dim, latent_frames=None, text_len=TEXT_LEN):
  """A folder shaped like ``python -m jaxwm.data.ingest`` output for the ``data`` block's VAE and text encoder,
  so that a records config compiles before any video is encoded: the manifest (``latent_frames`` latents of
  ``frame_hw = (H, W)`` frames; default: the window's span ``(num_frames - 1) * frame_stride + 1``), one shard
  holding one unread stand-in record (the records source needs a shard) and a zero ``null_text_emb.npy
  [text_len, text_dim]``. Nothing in it is ever decoded; returns ``path``."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  from jaxwm.data import ingest, records  # pylint: disable=g-import-not-at-top
  from jaxwm.encoders import autoencoder_geometry  # pylint: disable=g-import-not-at-top
  geometry = autoencoder_geometry(data.vae)
  if geometry is None:
    raise ValueError(f"data.vae={data.vae!r}: a plug-in VAE; its latent shape is known only from an ingested "
                     "dataset's manifest")
  spatial, temporal, channels = geometry
  h, w = frame_hw
  if h < spatial or w < spatial or h % spatial or w % spatial:
    raise ValueError(f"--frame_size={h}x{w}: must be positive multiples of {spatial} (the spatial stride of "
                     f"{data.vae})")
  n = latent_frames or (data.num_frames - 1) * data.frame_stride + 1
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  settings = {"format": ingest.FORMAT, "record_version": records.RECORD_VERSION, "height": h, "width": w,
              "clip_frames": 1 + temporal * (n - 1), "fps": None, "stride": None, "hop": None,
              "max_clips_per_video": 0, "vae": data.vae, "temporal_stride": temporal, "spatial_stride": spatial,
              "text_encoder": data.text_encoder, "dtype": "float32"}
  shard = "train-00000.array_record"
  writer = ArrayRecordWriter(str(path / shard), "group_size:1")
  writer.write(b"compile-only stand-in, never read")
  writer.close()
  np.save(path / records.NULL_TEXT, np.zeros((text_len, text_dim), np.float32))
  (path / records.MANIFEST).write_text(json.dumps(
      {"settings": settings, "latent_shape": [n, h // spatial, w // spatial, channels],
       "shards": [{"file": shard, "split": "train", "num_clips": 1, "clips": ["stand-in"]}], "done": {}}))
  return str(path)


def run(config, topology, what="train"):
  """Compiles ``what`` (``train`` | ``sample``) of ``config`` for ``topology``, prints the report and returns
  ``(lines, fits)``."""
  if what not in WHAT:
    raise ValueError(f"--compile_only={what!r}: must be one of {WHAT}")
  gen, chip, chips = parse_topology(topology)
  devices = topology_devices(topology)
  if not config.data.get("batch_size", 0):  # 0: per-device batch x the topology's chips on the batch axes
    from jaxwm.training.sharding import resolve_batch_size  # pylint: disable=g-import-not-at-top
    resolve_batch_size(config, chips)
  head = (f"{what} step of model dim {config.model.dim} x {config.model.num_layers} layers on {topology} "
          f"({chips} chips of {gen}); mesh data={config.mesh.data} fsdp={config.mesh.fsdp}; remat={config.model.remat}")
  lines, fits = [head], True
  cache_on = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)  # TPU executables cannot be loaded here anyway
  try:
    if what == "train":
      try:
        compiled, flops = compile_train(config, devices)
        out, fits = report(compiled, chip, "train step", flops)
      except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses programs over the chip's HBM
        if "RESOURCE_EXHAUSTED" not in str(e):
          raise
        out, fits = [f"train step: DOES NOT FIT: {str(e).splitlines()[0]}"], False
      lines += out
    else:
      for label, (compiled, flops) in zip(("denoise chunk", "commit chunk"), compile_sample(config, devices)):
        out, ok = report(compiled, chip, label, flops)
        lines += out
        fits = fits and ok
  finally:
    jax.config.update("jax_enable_compilation_cache", cache_on)
  for line in lines:
    print(line)
  return lines, fits
