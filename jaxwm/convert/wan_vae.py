"""Wan VAE weights: diffusers ``AutoencoderKLWan`` <-> jaxwm ``WanVAE`` parameters, and original Wan names.

One table (:func:`parameter_mapping`) names, for every jaxwm parameter, its diffusers key and layout:

- ``conv``: torch ``[O, I, *k]`` -> flax ``[*k, I, O]`` (3x3x3 and (3,1,1) causal convs, 3x3 resample convs);
- ``pointwise3d`` / ``pointwise2d``: torch kernel-1 convs ``[O, I, 1, 1, 1]`` / ``[O, I, 1, 1]`` -> dense ``[I, O]``;
- ``gamma3d`` / ``gamma2d``: RMS-norm gains ``[C, 1, 1, 1]`` / ``[C, 1, 1]`` -> ``[C]``;
- ``copy``: biases.

Original checkpoints (``Wan2.1_VAE.pth``, ``Wan2.2_VAE.pth``: ``encoder.conv1``, ``encoder.downsamples.0.residual.0
.gamma``, ``decoder.upsamples...``, top-level ``conv1``/``conv2``) are renamed to diffusers keys first
(:func:`original_wan_vae_to_diffusers_keys`, the renaming of diffusers' ``scripts/convert_wan_to_diffusers.py``).
"""

import re

import numpy as np

from jaxwm.models.wan_vae import WanVAEConfig
from jaxwm.models.wan_vae_blocks import decoder_plan, encoder_plan
from jaxwm.convert.files import read_state_dict, to_numpy
from jaxwm.convert.tree import get_path, set_path


def _conv(path, key, kind="conv"):
  return [((*path, "kernel"), f"{key}.weight", kind), ((*path, "bias"), f"{key}.bias", "copy")]


def _resnet(path, key, in_dim, out_dim):
  out = [((*path, "norm1", "scale"), f"{key}.norm1.gamma", "gamma3d"), *_conv((*path, "conv1"), f"{key}.conv1"),
         ((*path, "norm2", "scale"), f"{key}.norm2.gamma", "gamma3d"), *_conv((*path, "conv2"), f"{key}.conv2")]
  if in_dim != out_dim:
    out += _conv((*path, "conv_shortcut"), f"{key}.conv_shortcut", "pointwise3d")
  return out


def _attention(path, key):
  return [((*path, "norm", "scale"), f"{key}.norm.gamma", "gamma2d"),
          *_conv((*path, "to_qkv"), f"{key}.to_qkv", "pointwise2d"),
          *_conv((*path, "proj"), f"{key}.proj", "pointwise2d")]


def _resample(path, key, mode):
  out = _conv((*path, "resample"), f"{key}.resample.1")
  return out + (_conv((*path, "time_conv"), f"{key}.time_conv") if mode.endswith("3d") else [])


def _mid(path, key):
  return [*_resnet((*path, "resnets_0"), f"{key}.resnets.0", 1, 1),
          *_attention((*path, "attentions_0"), f"{key}.attentions.0"),
          *_resnet((*path, "resnets_1"), f"{key}.resnets.1", 1, 1)]


def _blocks(path, key, stage, sub):
  """Entries of one block with ``stage.num_res`` resnets and its resampler named ``sub``."""
  out, cin = [], stage.in_dim
  for j in range(stage.num_res):
    out += _resnet((*path, f"resnets_{j}"), f"{key}.resnets.{j}", cin, stage.out_dim)
    cin = stage.out_dim
  if stage.mode:
    out += _resample((*path, sub.replace(".", "_")), f"{key}.{sub}", stage.mode)
  return out


def parameter_mapping(cfg: WanVAEConfig):
  """Every jaxwm parameter as ``(path under params, diffusers key, kind)``."""
  table = [*_conv(("quant_conv",), "quant_conv", "pointwise3d"),
           *_conv(("post_quant_conv",), "post_quant_conv", "pointwise3d")]
  enc, dec = ("encoder",), ("decoder",)
  table += _conv((*enc, "conv_in"), "encoder.conv_in")
  for k, s in enumerate(encoder_plan(cfg)):
    path, key = (*enc, f"down_blocks_{k}"), f"encoder.down_blocks.{k}"
    if s.kind == "res":
      table += _resnet(path, key, s.in_dim, s.out_dim)
    elif s.kind == "resample":
      table += _resample(path, key, s.mode)
    else:
      table += _blocks(path, key, s, "downsampler")
  table += [*_mid((*enc, "mid_block"), "encoder.mid_block"),
            ((*enc, "norm_out", "scale"), "encoder.norm_out.gamma", "gamma3d"),
            *_conv((*enc, "conv_out"), "encoder.conv_out"), *_conv((*dec, "conv_in"), "decoder.conv_in"),
            *_mid((*dec, "mid_block"), "decoder.mid_block")]
  for k, s in enumerate(decoder_plan(cfg)):
    table += _blocks((*dec, f"up_blocks_{k}"), f"decoder.up_blocks.{k}", s,
                     "upsampler" if s.kind == "res_up" else "upsamplers.0")
  table += [((*dec, "norm_out", "scale"), "decoder.norm_out.gamma", "gamma3d"),
            *_conv((*dec, "conv_out"), "decoder.conv_out")]
  return table


def _to_jax(a, kind):
  a = np.asarray(a, np.float32)
  if kind == "conv":
    return a.transpose(*range(2, a.ndim), 1, 0)
  if kind.startswith("pointwise"):
    return a.reshape(a.shape[:2]).T
  if kind.startswith("gamma"):
    return a.reshape(-1)
  return a


def _to_torch(a, kind):
  a = np.asarray(a)
  if kind == "conv":
    n = a.ndim
    return a.transpose(n - 1, n - 2, *range(n - 2))
  if kind.startswith("pointwise"):
    return a.T.reshape(a.shape[1], a.shape[0], *(1,) * (3 if kind.endswith("3d") else 2))
  if kind.startswith("gamma"):
    return a.reshape(-1, *(1,) * (3 if kind.endswith("3d") else 2))
  return a


def diffusers_to_jaxwm(state_dict, cfg: WanVAEConfig, strict=True):
  """A diffusers ``AutoencoderKLWan`` state dict (name -> array-like) -> ``{"params": ...}`` (numpy float32).

  Missing keys are an error; so are unused ones with ``strict``.
  """
  sd = {k: to_numpy(v) for k, v in state_dict.items()}
  params, used, missing = {}, set(), []
  for path, key, kind in parameter_mapping(cfg):
    if key not in sd:
      missing.append(key)
      continue
    set_path(params, path, _to_jax(sd[key], kind))
    used.add(key)
  if missing:
    raise KeyError(f"state dict lacks {len(missing)} key(s) the Wan VAE needs, e.g. {missing[:5]}")
  unused = sorted(set(sd) - used)
  if strict and unused:
    raise KeyError(f"state dict has {len(unused)} key(s) no Wan VAE parameter uses, e.g. {unused[:5]}")
  return {"params": params}


def jaxwm_to_diffusers(variables, cfg: WanVAEConfig):
  """Inverse of :func:`diffusers_to_jaxwm`: ``{"params": ...}`` -> diffusers-named numpy arrays."""
  params = variables["params"]
  return {key: _to_torch(get_path(params, path), kind) for path, key, kind in parameter_mapping(cfg)}


_RESNET_PARTS = [(r"\.residual\.0\.", ".norm1."), (r"\.residual\.2\.", ".conv1."), (r"\.residual\.3\.", ".norm2."),
                 (r"\.residual\.6\.", ".conv2."), (r"\.shortcut\.", ".conv_shortcut.")]
_COMMON = [(r"^conv1\.", "quant_conv."), (r"^conv2\.", "post_quant_conv."),
           (r"^(encoder|decoder)\.conv1\.", r"\1.conv_in."),
           (r"^(encoder|decoder)\.middle\.0\.", r"\1.mid_block.resnets.0."),
           (r"^(encoder|decoder)\.middle\.1\.", r"\1.mid_block.attentions.0."),
           (r"^(encoder|decoder)\.middle\.2\.", r"\1.mid_block.resnets.1."),
           (r"^(encoder|decoder)\.head\.0\.", r"\1.norm_out."), (r"^(encoder|decoder)\.head\.2\.", r"\1.conv_out.")]


def _original_key(key, cfg):
  for pattern, repl in _COMMON:
    key = re.sub(pattern, repl, key)
  n = cfg.num_res_blocks
  if cfg.is_residual:  # Wan2.2: blocks hold a Sequential of resnets then the resampler
    m = re.match(r"^encoder\.downsamples\.(\d+)\.downsamples\.(\d+)\.(.*)$", key)
    if m:
      i, j, rest = int(m[1]), int(m[2]), m[3]
      key = f"encoder.down_blocks.{i}." + (f"resnets.{j}.{rest}" if j < n else f"downsampler.{rest}")
    m = re.match(r"^decoder\.upsamples\.(\d+)\.upsamples\.(\d+)\.(.*)$", key)
    if m:
      i, j, rest = int(m[1]), int(m[2]), m[3]
      key = f"decoder.up_blocks.{i}." + (f"resnets.{j}.{rest}" if j < n + 1 else f"upsampler.{rest}")
  else:  # Wan2.1: flat Sequentials; the decoder has n + 1 resnets and a resampler per level
    key = re.sub(r"^encoder\.downsamples\.", "encoder.down_blocks.", key)
    m = re.match(r"^decoder\.upsamples\.(\d+)\.(.*)$", key)
    if m:
      level, r = divmod(int(m[1]), n + 2)
      key = f"decoder.up_blocks.{level}." + (f"resnets.{r}.{m[2]}" if r < n + 1 else f"upsamplers.0.{m[2]}")
  for pattern, repl in _RESNET_PARTS:
    key = re.sub(pattern + r"(weight|bias|gamma)$", repl + r"\1", key)
  return key


def original_wan_vae_to_diffusers_keys(state_dict, cfg: WanVAEConfig):
  """Renames an original Wan VAE state dict (``Wan2.1_VAE.pth`` / ``Wan2.2_VAE.pth`` names) to diffusers keys.

  Follows diffusers' ``convert_vae`` / ``convert_vae_22``: ``conv1``/``conv2`` -> ``quant_conv``/
  ``post_quant_conv``; ``{encoder,decoder}.conv1`` -> ``conv_in``; ``middle.{0,1,2}`` -> ``mid_block.{resnets.0,
  attentions.0, resnets.1}``; ``head.{0,2}`` -> ``norm_out``/``conv_out``; ``residual.{0,2,3,6}`` -> ``norm1, conv1,
  norm2, conv2``; ``shortcut`` -> ``conv_shortcut``; the down/up block indices as ``cfg`` lays them out.
  """
  return {_original_key(k, cfg): v for k, v in state_dict.items()}


def _is_original(keys):
  return any(k.startswith(("encoder.downsamples.", "encoder.conv1.", "decoder.middle.")) or k == "conv1.weight"
             for k in keys)


def load_wan_vae_safetensors(paths, cfg: WanVAEConfig, abstract_params=None, shardings=None, original_names=None):
  """Loads Wan VAE weights straight into (sharded) jax arrays.

  Args:
    paths: a path or list of paths: diffusers ``diffusion_pytorch_model*.safetensors``, or an original Wan
      checkpoint (``.safetensors``, or ``.pth`` read with ``torch.load(weights_only=True)``).
    cfg: the VAE config the weights must fit.
    abstract_params: optional ``jax.eval_shape`` of the init (``{"params": ...}``), to check shapes.
    shardings: optional pytree of ``jax.sharding.Sharding`` matching ``{"params": ...}``; each array is
      ``jax.device_put`` to its sharding.
    original_names: force (True/False) or auto-detect (None) original Wan key names.

  Returns:
    ``{"params": ...}`` of jax arrays (float32).
  """
  import jax  # pylint: disable=g-import-not-at-top
  sd = read_state_dict(paths)
  if original_names or (original_names is None and _is_original(sd)):
    sd = original_wan_vae_to_diffusers_keys(sd, cfg)
  tree = diffusers_to_jaxwm(sd, cfg)
  if abstract_params is not None:
    want = jax.tree_util.tree_map(lambda a: tuple(a.shape), abstract_params)
    got = jax.tree_util.tree_map(lambda a: tuple(a.shape), tree)
    if want != got:
      raise ValueError("Wan VAE checkpoint shapes do not match the config")
  if shardings is None:
    return jax.tree_util.tree_map(jax.numpy.asarray, tree)
  return jax.tree_util.tree_map(jax.device_put, tree, shardings)
