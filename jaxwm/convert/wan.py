"""Wan transformer weights: diffusers ``WanTransformer3DModel`` <-> jaxwm ``WanModel`` parameters.

One table (:func:`parameter_mapping`) names, for every jaxwm parameter, its diffusers key
(per block for the scanned ``blocks`` stack) and how the array is laid out:

- ``linear``: torch ``[out, in]`` -> flax kernel ``[in, out]``;
- ``conv3d``: the patch embedding ``[dim, C, pt, ph, pw]`` -> kernel ``[pt*ph*pw*C, dim]``
  (jaxwm patchifies as ``(pt, ph, pw, C)``, C fastest);
- ``copy``: biases, norm scales and modulation tables.

Original Wan checkpoints (``blocks.0.self_attn.q.weight``, ...) are renamed to diffusers keys
first (:func:`original_wan_to_diffusers_keys`).
"""

import re

import numpy as np

from jaxwm.models.config import ModelConfig
from jaxwm.convert.files import read_state_dict, to_numpy
from jaxwm.convert.tree import get_path, set_path


def _attn_entries(prefix, torch_prefix):
  out = []
  for name, key in [("to_q", "to_q"), ("to_k", "to_k"), ("to_v", "to_v"), ("to_out", "to_out.0")]:
    out.append(((*prefix, name, "kernel"), f"{torch_prefix}.{key}.weight", "linear"))
    out.append(((*prefix, name, "bias"), f"{torch_prefix}.{key}.bias", "copy"))
  out.append(((*prefix, "norm_q", "scale"), f"{torch_prefix}.norm_q.weight", "copy"))
  out.append(((*prefix, "norm_k", "scale"), f"{torch_prefix}.norm_k.weight", "copy"))
  return out


def _linear(path, key):
  return [((*path, "kernel"), f"{key}.weight", "linear"), ((*path, "bias"), f"{key}.bias", "copy")]


def parameter_mapping(cfg: ModelConfig):
  """``(global_entries, block_entries)``: lists of ``(jaxwm path, diffusers key, kind)``.

  Block entries use ``{i}`` in the key for the layer index; their jaxwm arrays are stacked
  over layers on axis 0 under ``blocks``.
  """
  glob = [
      (("patch_embedding", "kernel"), "patch_embedding.weight", "conv3d"),
      (("patch_embedding", "bias"), "patch_embedding.bias", "copy"),
      *_linear(("condition_embedder", "time_embedder_1"), "condition_embedder.time_embedder.linear_1"),
      *_linear(("condition_embedder", "time_embedder_2"), "condition_embedder.time_embedder.linear_2"),
      *_linear(("condition_embedder", "time_proj"), "condition_embedder.time_proj"),
      (("scale_shift_table",), "scale_shift_table", "copy"),
      *_linear(("proj_out",), "proj_out"),
  ]
  block = [
      (("scale_shift_table",), "blocks.{i}.scale_shift_table", "copy"),
      *_attn_entries(("attn1",), "blocks.{i}.attn1"),
      *_linear(("ffn_in",), "blocks.{i}.ffn.net.0.proj"),
      *_linear(("ffn_out",), "blocks.{i}.ffn.net.2"),
  ]
  if cfg.cross_attn:
    glob += [*_linear(("text_embedder", "linear_1"), "condition_embedder.text_embedder.linear_1"),
             *_linear(("text_embedder", "linear_2"), "condition_embedder.text_embedder.linear_2")]
    block += _attn_entries(("attn2",), "blocks.{i}.attn2")
    if cfg.cross_attn_norm:
      block += [(("norm2", "scale"), "blocks.{i}.norm2.weight", "copy"),
                (("norm2", "bias"), "blocks.{i}.norm2.bias", "copy")]
  return glob, block


def _to_jax(a, kind):
  a = np.asarray(a, np.float32)
  if kind == "linear":
    return a.T
  if kind == "conv3d":
    return a.transpose(2, 3, 4, 1, 0).reshape(-1, a.shape[0])
  return a


def _to_torch(a, kind, cfg):
  a = np.asarray(a)
  if kind == "linear":
    return a.T
  if kind == "conv3d":
    pt, ph, pw = cfg.patch_size
    return a.reshape(pt, ph, pw, -1, a.shape[-1]).transpose(4, 3, 0, 1, 2)
  return a


def diffusers_to_jaxwm(state_dict, cfg: ModelConfig, strict=True):
  """Maps a diffusers state dict (name -> array-like) to a jaxwm ``{"params": ...}`` tree (numpy).

  With ``strict``, keys of the state dict that no parameter uses are an error (listed).
  Missing keys are always an error.
  """
  sd = {k: to_numpy(v) for k, v in state_dict.items()}
  glob, block = parameter_mapping(cfg)
  params, used, missing = {}, set(), []
  for path, key, kind in glob:
    if key not in sd:
      missing.append(key)
      continue
    set_path(params, path, _to_jax(sd[key], kind))
    used.add(key)
  for path, key, kind in block:
    layers = []
    for i in range(cfg.num_layers):
      k = key.format(i=i)
      if k not in sd:
        missing.append(k)
        continue
      layers.append(_to_jax(sd[k], kind))
      used.add(k)
    if len(layers) == cfg.num_layers:
      set_path(params, ("blocks", *path), np.stack(layers))
  if missing:
    raise KeyError(f"state dict lacks {len(missing)} key(s) the jaxwm model needs, e.g. {missing[:5]}")
  unused = sorted(set(sd) - used)
  if strict and unused:
    raise KeyError(f"state dict has {len(unused)} key(s) no jaxwm parameter uses, e.g. {unused[:5]}")
  return {"params": params}


def jaxwm_to_diffusers(variables, cfg: ModelConfig):
  """Inverse of :func:`diffusers_to_jaxwm`: ``{"params": ...}`` -> diffusers-named numpy arrays."""
  params = variables["params"]
  glob, block = parameter_mapping(cfg)
  out = {key: _to_torch(get_path(params, path), kind, cfg) for path, key, kind in glob}
  for path, key, kind in block:
    stacked = np.asarray(get_path(params["blocks"], path))
    for i in range(cfg.num_layers):
      out[key.format(i=i)] = _to_torch(stacked[i], kind, cfg)
  return out


# Original Wan names -> diffusers names, applied in order to each key.
_ORIGINAL_RENAMES = [
    (r"^model\.diffusion_model\.", ""),
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^head\.head\.", "proj_out."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"^blocks\.(\d+)\.modulation$", r"blocks.\1.scale_shift_table"),
    (r"^blocks\.(\d+)\.self_attn\.", r"blocks.\1.attn1."),
    (r"^blocks\.(\d+)\.cross_attn\.", r"blocks.\1.attn2."),
    (r"\.attn([12])\.o\.", r".attn\1.to_out.0."),
    (r"\.attn([12])\.([qkv])\.", r".attn\1.to_\2."),
    (r"^blocks\.(\d+)\.norm3\.", r"blocks.\1.norm2."),  # Wan's norm3 is the cross-attention norm
    (r"^blocks\.(\d+)\.ffn\.0\.", r"blocks.\1.ffn.net.0.proj."),
    (r"^blocks\.(\d+)\.ffn\.2\.", r"blocks.\1.ffn.net.2."),
]


def original_wan_to_diffusers_keys(state_dict):
  """Renames an original Wan transformer state dict (``blocks.0.self_attn.q.weight``, ...) to diffusers keys."""
  out = {}
  for key, value in state_dict.items():
    new = key
    for pattern, repl in _ORIGINAL_RENAMES:
      new = re.sub(pattern, repl, new)
    out[new] = value
  return out


def load_wan_safetensors(paths, cfg: ModelConfig, abstract_params=None, shardings=None, original_names=None):
  """Loads Wan weights from safetensors file(s) straight into (sharded) jax arrays.

  Args:
    paths: a path or a list of shard paths.
    cfg: the model config the weights must fit.
    abstract_params: optional ``jax.eval_shape`` of the init, to check shapes.
    shardings: optional pytree of ``jax.sharding.Sharding`` matching ``{"params": ...}``;
      each array is built shard by shard (``jax.make_array_from_callback``).
    original_names: force (True/False) or auto-detect (None) original Wan key names.

  Returns:
    ``{"params": ...}`` of jax arrays.
  """
  import jax  # pylint: disable=g-import-not-at-top
  sd = read_state_dict(paths)
  if original_names or (original_names is None and any(".self_attn." in k or k.startswith("head.") for k in sd)):
    sd = original_wan_to_diffusers_keys(sd)
  tree = diffusers_to_jaxwm(sd, cfg)
  if abstract_params is not None:
    want = jax.tree_util.tree_map(lambda a: a.shape, abstract_params)
    got = jax.tree_util.tree_map(lambda a: a.shape, tree)
    if want != got:
      raise ValueError("checkpoint shapes do not match the model config")
  if shardings is None:
    return jax.tree_util.tree_map(jax.numpy.asarray, tree)
  return jax.tree_util.tree_map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda idx: a[idx]), tree,
                                shardings)


def backbone_config(cfg: ModelConfig):
  """``cfg`` without what the released Wan transformer lacks: LOCI memory, Plücker injection and parameterised
  camera encodings (their parameters start from their own initialisation when fine-tuning)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(cfg, loci=dataclasses.replace(cfg.loci, enabled=False),
                             camera=dataclasses.replace(cfg.camera, encoding="rope3d", plucker=False))


def _read_state_dict(paths):
  sd = read_state_dict(paths)
  if any(".self_attn." in k or k.startswith("head.") for k in sd):
    sd = original_wan_to_diffusers_keys(sd)
  return sd


def pretrained_params(paths, cfg: ModelConfig, params):
  """The released Wan transformer's weights in a model that may add to it (fine-tuning's starting point).

  Args:
    paths: diffusers ``diffusion_pytorch_model*.safetensors`` files, or a directory of them (original Wan
      names are renamed).
    cfg: the fine-tuned model's config (any encoding, Plücker, LOCI).
    params: that model's freshly initialised parameters (``{"blocks"...}``, not boxed; jax or numpy arrays).

  Returns:
    ``(params, loaded, kept)``: ``params`` with every backbone parameter from the checkpoint (cast to the
    fresh leaf's dtype, placed with its sharding when it has one), and the ``/``-joined paths loaded and kept
    at their initialisation (the additions: camera path, memory).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jaxwm.models.layer_stacks import split_layers  # pylint: disable=g-import-not-at-top
  tree = diffusers_to_jaxwm(_read_state_dict(paths), backbone_config(cfg))["params"]
  if len(cfg.layer_groups) > 1:
    in_file = set(tree["blocks"])
    tree = split_layers(tree, cfg, fill=params)
    tree = {k: ({n: v for n, v in g.items() if n in in_file} if k.startswith("blocks_") else g)
            for k, g in tree.items()}  # memory parameters came from the fresh init: kept, not loaded
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
  loaded, kept = [], []

  def take(path, leaf):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    src = flat.get(name)
    if src is None:
      kept.append(name)
      return leaf
    if tuple(src.shape) != tuple(leaf.shape):
      raise ValueError(f"Wan checkpoint parameter {name} has shape {tuple(src.shape)}; the model's is "
                       f"{tuple(leaf.shape)}")
    loaded.append(name)
    src = np.asarray(src).astype(leaf.dtype)
    sharding = getattr(leaf, "sharding", None)
    return jax.device_put(src, sharding) if sharding is not None else src

  out = jax.tree_util.tree_map_with_path(take, params)
  return out, loaded, kept


# The authors' WanModel.__init__ defaults (its config.json leaves out patch_size, text_dim, qk_norm, cross_attn_norm
# and window_size) and diffusers' WanTransformer3DModel defaults.
_AUTHORS_DEFAULTS = dict(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=2048, ffn_dim=8192, freq_dim=256,
                         text_dim=4096, out_dim=16, num_heads=16, num_layers=32, window_size=(-1, -1), qk_norm=True,
                         cross_attn_norm=True, eps=1e-6)
_DIFFUSERS_DEFAULTS = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                           out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                           cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                           added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None)
BACKBONE_FIELDS = ("dim", "num_heads", "num_layers", "ffn_dim", "in_channels", "out_channels", "patch_size",
                   "text_dim", "freq_dim", "eps", "cross_attn", "cross_attn_norm")


def transformer_config(d, source="config.json"):
  """A transformer ``config.json`` (diffusers' ``WanTransformer3DModel`` or the authors' ``WanModel``) ->
  ``(ModelConfig, diffusers kwargs)``: jaxwm's backbone shape and the keyword arguments that build the same
  model in diffusers. What jaxwm cannot run (image conditioning, windowed attention, no q/k norm) is a
  one-line ``ValueError`` naming ``source`` and the field."""
  def bad(field, value, allowed):
    return ValueError(f"{source}: {field}={value!r}: {allowed}")

  if "num_attention_heads" in d or d.get("_class_name") == "WanTransformer3DModel":
    unknown = sorted(k for k in d if not k.startswith("_") and k not in _DIFFUSERS_DEFAULTS)
    if unknown:
      raise bad(unknown[0], d[unknown[0]], f"not a WanTransformer3DModel field (those are {sorted(_DIFFUSERS_DEFAULTS)})")
    kw = {**_DIFFUSERS_DEFAULTS, **{k: v for k, v in d.items() if not k.startswith("_")}}
    for field in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
      if kw[field] is not None:
        raise bad(field, kw[field], "image conditioning (Wan2.1 I2V) is not part of jaxwm's backbone; must be null")
    heads, head_dim = kw["num_attention_heads"], kw["attention_head_dim"]
    shape = dict(dim=heads * head_dim, num_heads=heads, in_channels=kw["in_channels"], out_channels=kw["out_channels"])
  elif "dim" in d or d.get("_class_name") == "WanModel":
    unknown = sorted(k for k in d if not k.startswith("_") and k not in _AUTHORS_DEFAULTS and k != "text_len")
    if unknown:
      raise bad(unknown[0], d[unknown[0]], f"not a Wan WanModel field (those are {sorted(_AUTHORS_DEFAULTS)})")
    a = {**_AUTHORS_DEFAULTS, **{k: v for k, v in d.items() if not k.startswith("_")}}
    if a["model_type"] not in ("t2v", "ti2v"):
      raise bad("model_type", a["model_type"], "jaxwm runs the t2v and ti2v backbones (i2v and s2v add inputs)")
    if tuple(a["window_size"]) != (-1, -1):
      raise bad("window_size", a["window_size"], "windowed attention is not supported; must be [-1, -1]")
    if not a["qk_norm"]:
      raise bad("qk_norm", a["qk_norm"], "must be true (every released Wan model)")
    kw = dict(patch_size=tuple(a["patch_size"]), num_attention_heads=a["num_heads"],
              attention_head_dim=a["dim"] // a["num_heads"], in_channels=a["in_dim"], out_channels=a["out_dim"],
              text_dim=a["text_dim"], freq_dim=a["freq_dim"], ffn_dim=a["ffn_dim"], num_layers=a["num_layers"],
              cross_attn_norm=a["cross_attn_norm"], qk_norm="rms_norm_across_heads", eps=a["eps"])
    shape = dict(dim=a["dim"], num_heads=a["num_heads"], in_channels=a["in_dim"], out_channels=a["out_dim"])
  else:
    raise ValueError(f"{source}: neither a diffusers WanTransformer3DModel config (num_attention_heads, ...) nor the "
                     "authors' WanModel config (dim, num_heads, ...)")
  if kw["qk_norm"] != "rms_norm_across_heads":
    raise bad("qk_norm", kw["qk_norm"], "must be 'rms_norm_across_heads' (every released Wan model)")
  try:
    cfg = ModelConfig(**shape, num_layers=kw["num_layers"], ffn_dim=kw["ffn_dim"], patch_size=tuple(kw["patch_size"]),
                      text_dim=kw["text_dim"], freq_dim=kw["freq_dim"], eps=kw["eps"], cross_attn=True,
                      cross_attn_norm=bool(kw["cross_attn_norm"]))
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: {' '.join(str(e).split())}") from None
  kw["patch_size"] = tuple(kw["patch_size"])
  return cfg, kw


def folder_transformer_config(path):
  """:func:`transformer_config` of the ``config.json`` beside the weights (``path``: a folder or one of its
  files), or None when there is none."""
  import json  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  p = pathlib.Path(path).expanduser()
  f = (p if p.is_dir() else p.parent) / "config.json"
  if not f.is_file():
    return None
  try:
    d = json.loads(f.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f"{f}: not a readable JSON config ({e})") from None
  return transformer_config(d, str(f))


def check_backbone(cfg: ModelConfig, file_cfg: ModelConfig, source):
  """Raises a one-line ``ValueError`` naming every backbone field where the run's ``cfg`` and the checkpoint's
  ``file_cfg`` differ."""
  diff = [f"{k}: run {getattr(cfg, k)!r}, checkpoint {getattr(file_cfg, k)!r}" for k in BACKBONE_FIELDS
          if getattr(cfg, k) != getattr(file_cfg, k)]
  if diff:
    raise ValueError(f"{source} describes another transformer than model.*: " + "; ".join(diff))
