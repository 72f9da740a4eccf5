"""Parity of the Wan VAE: the user's weights in diffusers' ``AutoencoderKLWan`` and in jaxwm's ``WanVAE``, on
the same seeded random clip and latents.

Compared: the encoder's output (before the posterior's projection; diffusers encodes chunk by chunk, its chunks
are concatenated in time), the posterior mean and log-variance, the decoded video of seeded random latents; then
the gradients of ``L = mean(mean * r1) + mean(decoded * r2)`` with respect to the clip, the latents and every
parameter group (per encoder and decoder stage: ``conv_in``, each down/up block, the mid block, the head; the
posterior projections).
"""

import json
import pathlib
import re

import numpy as np

from jaxwm.parity.reference import bfloat16_twin, load_reference, quiet, round_weights
from jaxwm.parity.report import TOLERANCE, Report, group_gradients


def _group(name):
  m = re.match(r"(encoder|decoder)\.(down_blocks|up_blocks)\.(\d+)\.", name)
  if m:
    return f"{m.group(1)}.{m.group(2)}.{m.group(3)}"
  parts = name.split(".")
  return ".".join(parts[:2]) if parts[0] in ("encoder", "decoder") else parts[0]


def load(path, dtype, version="wan2.2"):
  """``(torch model, WanVAEConfig, jaxwm variables)``. ``path``: a diffusers ``vae/`` folder (its ``config.json``
  is read: any size) or a weights file (the release's ``Wan2.2_VAE.pth`` / ``Wan2.1_VAE.pth``, original names
  renamed; the full-size config of ``version``)."""
  import diffusers  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.files import read_state_dict  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.wan_vae import _is_original, diffusers_to_jaxwm, original_wan_vae_to_diffusers_keys  # pylint: disable=g-import-not-at-top
  from jaxwm.models.wan_vae import WanVAEConfig  # pylint: disable=g-import-not-at-top
  p = pathlib.Path(path)
  cfg_file = (p if p.is_dir() else p.parent) / "config.json"
  if cfg_file.is_file():
    cfg = WanVAEConfig.from_diffusers(json.loads(cfg_file.read_text()))
  else:
    cfg = WanVAEConfig.wan21() if version == "wan2.1" else WanVAEConfig.wan22()
  sd = read_state_dict(p)
  if _is_original(sd):
    sd = original_wan_vae_to_diffusers_keys(sd, cfg)
  sd = round_weights(sd, dtype)
  tm = load_reference(diffusers.AutoencoderKLWan(**cfg.to_diffusers()), sd, path)
  return tm, cfg, diffusers_to_jaxwm(sd, cfg)


def inputs(cfg, frames, height, width, batch, seed):
  """A seeded clip ``[B, frames, height, width, 3]`` in ``[-1, 1]``, latents of its latent shape, weights r1, r2."""
  rng = np.random.default_rng(seed)
  s, ft = cfg.scale_factor_spatial, cfg.scale_factor_temporal
  lat = (batch, 1 + (frames - 1) // ft, height // s, width // s, cfg.z_dim)
  return {"video": rng.uniform(-1, 1, (batch, frames, height, width, 3)).astype(np.float32),
          "z": rng.normal(size=lat).astype(np.float32), "r1": rng.normal(size=lat).astype(np.float32),
          "r2": rng.normal(size=(batch, frames, height, width, 3)).astype(np.float32)}


def _cl(t):  # torch [B, C, T, H, W] -> channels-last float32 numpy
  return t.detach().float().permute(0, 2, 3, 4, 1).numpy()


def _torch_run(tm, inp):
  import torch  # pylint: disable=g-import-not-at-top
  tdtype = next(tm.parameters()).dtype
  chunks = []
  hook = tm.encoder.register_forward_hook(lambda _m, _i, o: chunks.append(o))
  video = torch.tensor(inp["video"]).permute(0, 4, 1, 2, 3).contiguous().to(tdtype).requires_grad_(True)
  z = torch.tensor(inp["z"]).permute(0, 4, 1, 2, 3).contiguous().to(tdtype).requires_grad_(True)
  tm.zero_grad(set_to_none=True)
  post = tm.encode(video).latent_dist
  hook.remove()
  decoded = tm.decode(z).sample
  loss = ((post.mean.float() * torch.tensor(inp["r1"]).permute(0, 4, 1, 2, 3)).mean()
          + (decoded.float() * torch.tensor(inp["r2"]).permute(0, 4, 1, 2, 3)).mean())
  loss.backward()
  acts = {"encoder": _cl(torch.cat(chunks, dim=2))}
  grads = {k: p.grad.float().numpy() for k, p in tm.named_parameters() if p.grad is not None}
  return acts, {"mean": _cl(post.mean), "logvar": _cl(post.logvar), "decoded": _cl(decoded)}, \
      {"video": _cl(video.grad), "latents": _cl(z.grad)}, grads


def _jax_run(cfg, variables, inp, dtype):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.wan_vae import jaxwm_to_diffusers  # pylint: disable=g-import-not-at-top
  from jaxwm.models.wan_vae import WanVAE  # pylint: disable=g-import-not-at-top
  vae = WanVAE(cfg, jnp.dtype(dtype))

  def run(v, video, z):
    (mean, logvar), state = vae.apply(v, video, method=WanVAE.encode, mutable=["intermediates"],
                                      capture_intermediates=lambda m, _: m.name == "encoder")
    return mean, logvar, vae.apply(v, z, method=WanVAE.decode), state["intermediates"]

  def loss(v, video, z):
    mean, _, decoded, _ = run(v, video, z)
    return jnp.mean(mean * inp["r1"]) + jnp.mean(decoded * inp["r2"])

  v = jax.tree_util.tree_map(jnp.asarray, variables)
  mean, logvar, decoded, inter = jax.jit(run)(v, inp["video"], inp["z"])
  gv, gvid, gz = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(v, inp["video"], inp["z"])
  acts = {"encoder": np.asarray(inter["encoder"]["__call__"][0][0], np.float32)}
  outs = {"mean": np.asarray(mean), "logvar": np.asarray(logvar), "decoded": np.asarray(decoded)}
  grads = jaxwm_to_diffusers(jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), gv), cfg)
  return acts, outs, {"video": np.asarray(gvid), "latents": np.asarray(gz)}, grads


def check(path, *, frames=5, height=32, width=32, batch=1, dtype="float32", seed=0, tol=None, version="wan2.2"):
  """The VAE's :class:`jaxwm.parity.report.Report` (``frames = 1 + 4k``; sizes multiples of the stride)."""
  tm, cfg, variables = load(path, dtype, version)
  s, ft = cfg.scale_factor_spatial, cfg.scale_factor_temporal
  if (frames - 1) % ft or height % s or width % s:
    raise ValueError(f"--frames/--height/--width {frames}/{height}/{width}: frames must be 1 + {ft}k and the sizes "
                     f"multiples of {s} (this VAE's strides)")
  inp = inputs(cfg, frames, height, width, batch, seed)
  quiet()
  ref = dict(zip(("acts", "outs", "gin", "grads"), _torch_run(tm, inp)))
  peer = dict(zip(ref, _torch_run(bfloat16_twin(tm), inp))) if dtype == "bfloat16" else None
  ours = dict(zip(ref, _jax_run(cfg, variables, inp, dtype)))
  p = (lambda k, n: None) if peer is None else (lambda k, n: peer[k][n])  # pylint: disable=unnecessary-lambda-assignment
  rep = Report(meta={"model": "vae", "weights": str(path), "z_dim": cfg.z_dim, "video": f"{batch}x{frames}x{height}x"
                     f"{width}x3", "dtype": dtype, "seed": seed}, tol=TOLERANCE[dtype] if tol is None else tol)
  rep.add("activation", "encoder", ours["acts"]["encoder"], ref["acts"]["encoder"], p("acts", "encoder"))
  for k in ("mean", "logvar", "decoded"):
    rep.add("output", k, ours["outs"][k], ref["outs"][k], p("outs", k))
  for k in ("video", "latents"):
    rep.add("gradient", f"d/d {k}", ours["gin"][k], ref["gin"][k], p("gin", k))
  group_gradients(rep, {k: ours["grads"][k] for k in ref["grads"]}, ref["grads"], _group,
                  None if peer is None else peer["grads"])
  return rep
