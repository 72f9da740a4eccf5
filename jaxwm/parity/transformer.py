"""Parity of the Wan transformer: the user's weights in diffusers' ``WanTransformer3DModel`` and in jaxwm's
``WanModel``, on the same seeded random inputs.

Compared: the patch embedding, the text embedding, every block's output, the velocity; then the gradients of
the fixed scalar loss ``L = mean(v * r)`` (``r`` a seeded random tensor of the velocity's shape) with respect to
the latents, the text context and every parameter group (per block: ``attn1``, ``attn2``, ``ffn``, ``norm2``,
``scale_shift_table``; the embeddings and the output head as their own groups).
"""

import dataclasses
import re

import numpy as np

from jaxwm.parity.reference import bfloat16_twin, load_reference, quiet, round_weights
from jaxwm.parity.report import TOLERANCE, Report, group_gradients


def _group(name):
  m = re.match(r"blocks\.(\d+)\.([a-z_0-9]+)", name)
  if m:
    return f"blocks.{m.group(1)}.{m.group(2)}"
  return name.split(".")[0] if not name.startswith("condition_embedder") else ".".join(name.split(".")[:2])


def load(path, dtype):
  """``(torch model, jaxwm ModelConfig, jaxwm variables)`` from a folder with ``config.json`` and the weights
  (diffusers ``transformer/`` or the authors' release folder; ``.safetensors`` shards, with or without their
  index JSON). The torch model (float32) must take every key of the file and no other."""
  import diffusers  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.wan import _read_state_dict, diffusers_to_jaxwm, folder_transformer_config  # pylint: disable=g-import-not-at-top
  found = folder_transformer_config(path)
  if found is None:
    raise ValueError(f"{path}: no config.json beside the transformer weights (a diffusers transformer/ folder or "
                     "the authors' release folder)")
  cfg, kwargs = found
  sd = round_weights(_read_state_dict(path), dtype)
  tm = load_reference(diffusers.WanTransformer3DModel(**kwargs), sd, path)
  return tm, dataclasses.replace(cfg, dtype=dtype), diffusers_to_jaxwm(sd, cfg)


def _tree_map(f, tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map(f, tree)


def inputs(cfg, frames, height, width, text_len, batch, seed):
  """Seeded random latents ``[B, F, H, W, C]``, one timestep per sample in ``[0, 1000)``, a text context
  ``[B, text_len, text_dim]`` and the loss weights ``r``."""
  rng = np.random.default_rng(seed)
  return {"x": rng.normal(size=(batch, frames, height, width, cfg.in_channels)).astype(np.float32),
          "t": rng.uniform(0, 1000, size=(batch,)).astype(np.float32),
          "ctx": rng.normal(size=(batch, text_len, cfg.text_dim)).astype(np.float32),
          "r": rng.normal(size=(batch, frames, height, width, cfg.out_channels)).astype(np.float32)}


def _torch_run(tm, inp):
  """Activations, output and gradients of diffusers' model (numpy float32, channels-last, token-major)."""
  import torch  # pylint: disable=g-import-not-at-top
  tdtype = tm.patch_embedding.weight.dtype
  acts = {}

  def keep(name, fn=lambda o: o):
    return lambda _m, _i, out: acts.__setitem__(name, fn(out).detach().float().numpy())

  hooks = [tm.patch_embedding.register_forward_hook(keep("patch_embedding", lambda o: o.flatten(2).transpose(1, 2))),
           tm.condition_embedder.text_embedder.register_forward_hook(keep("text_embedder"))]
  hooks += [b.register_forward_hook(keep(f"blocks.{i}")) for i, b in enumerate(tm.blocks)]
  x = torch.tensor(inp["x"]).permute(0, 4, 1, 2, 3).contiguous().to(tdtype).requires_grad_(True)
  ctx = torch.tensor(inp["ctx"]).to(tdtype).requires_grad_(True)
  tm.zero_grad(set_to_none=True)
  out = tm(hidden_states=x, timestep=torch.tensor(inp["t"]), encoder_hidden_states=ctx, return_dict=False)[0]
  out = out.permute(0, 2, 3, 4, 1)
  (out.float() * torch.tensor(inp["r"])).mean().backward()
  for h in hooks:
    h.remove()
  grads = {k: p.grad.float().numpy() for k, p in tm.named_parameters()}
  return acts, out.detach().float().numpy(), x.grad.float().permute(0, 2, 3, 4, 1).numpy(), ctx.grad.float().numpy(), \
      grads


def _jax_run(cfg, variables, inp):
  """The same from jaxwm (intermediates captured by module name; the layer scan stacks block outputs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.wan import jaxwm_to_diffusers  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  model = WanModel(cfg)
  t = np.repeat(inp["t"][:, None], inp["x"].shape[1] // cfg.patch_size[0], axis=1)
  wanted = ("patch_embedding", "text_embedder", "blocks")

  def forward(v, x, ctx):
    (out, _), state = model.apply(v, x, t, context=ctx, mutable=["intermediates"],
                                  capture_intermediates=lambda m, _: m.name in wanted)
    return out, state["intermediates"]

  def loss(v, x, ctx):
    out, _ = forward(v, x, ctx)
    return jnp.mean(out * inp["r"])

  v = _tree_map(jnp.asarray, variables)
  out, inter = jax.jit(forward)(v, inp["x"], inp["ctx"])
  gv, gx, gc = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(v, inp["x"], inp["ctx"])
  acts = {"patch_embedding": inter["patch_embedding"]["__call__"][0],
          "text_embedder": inter["text_embedder"]["__call__"][0]}
  stacked = inter["blocks"]["__call__"][0][0]  # [layers, B, L, D]
  acts.update({f"blocks.{i}": stacked[i] for i in range(cfg.num_layers)})
  grads = jaxwm_to_diffusers(_tree_map(lambda a: np.asarray(a, np.float32), gv), cfg)
  acts = {k: np.asarray(a, np.float32) for k, a in acts.items()}
  return acts, np.asarray(out), np.asarray(gx), np.asarray(gc), grads


def check(path, *, frames=2, height=4, width=4, text_len=8, batch=1, dtype="float32", seed=0, tol=None, wan_code=None):
  """The transformer's :class:`jaxwm.parity.report.Report` (shapes are latent sizes). ``wan_code``: a checkout of
  the authors' code; their ``WanModel`` is then the reference instead of diffusers' (float32 only:
  :mod:`jaxwm.parity.authors`)."""
  quiet()
  if wan_code is not None and dtype != "float32":
    raise ValueError(f"--wan-code with --dtype={dtype}: the authors' model runs bfloat16 only through CUDA "
                     "flash-attn; compare it in float32")
  tm, cfg, variables = load(path, dtype)
  ph, pw = cfg.patch_size[1:]
  if height % ph or width % pw or frames % cfg.patch_size[0]:
    raise ValueError(f"--frames/--height/--width {frames}/{height}/{width} must be multiples of the patch "
                     f"{cfg.patch_size}")
  inp = inputs(cfg, frames, height, width, text_len, batch, seed)
  if wan_code is None:
    ref = dict(zip(("acts", "out", "gx", "gc", "grads"), _torch_run(tm, inp)))
  else:
    from jaxwm.convert.wan import _read_state_dict, folder_transformer_config  # pylint: disable=g-import-not-at-top
    from jaxwm.parity import authors  # pylint: disable=g-import-not-at-top
    am, names = authors.build(wan_code, folder_transformer_config(path)[1], text_len, _read_state_dict(path), path)
    ref = dict(zip(("acts", "out", "gx", "gc", "grads"), authors.run(am, names, inp, cfg.patch_size)))
  peer = dict(zip(ref, _torch_run(bfloat16_twin(tm), inp))) if dtype == "bfloat16" else None
  ours = dict(zip(ref, _jax_run(cfg, variables, inp)))
  p = (lambda k: None) if peer is None else peer.get  # pylint: disable=unnecessary-lambda-assignment
  rep = Report(meta={"model": "transformer", "weights": str(path),
                     "reference": "diffusers" if wan_code is None else f"the authors' WanModel ({wan_code})",
                     "layers": cfg.num_layers, "dim": cfg.dim,
                     "latents": "x".join(map(str, inp["x"].shape)), "text_len": text_len, "dtype": dtype,
                     "seed": seed}, tol=TOLERANCE[dtype] if tol is None else tol)
  for name in ref["acts"]:
    rep.add("activation", name, ours["acts"][name], ref["acts"][name], None if peer is None else peer["acts"][name])
  rep.add("output", "velocity", ours["out"], ref["out"], p("out"))
  rep.add("gradient", "d/d latents", ours["gx"], ref["gx"], p("gx"))
  rep.add("gradient", "d/d context", ours["gc"], ref["gc"], p("gc"))
  group_gradients(rep, ours["grads"], ref["grads"], _group, p("grads"))
  return rep
