"""umT5 encoder weights: transformers ``UMT5EncoderModel`` <-> jaxwm ``UMT5Encoder`` parameters.

One table (:func:`parameter_mapping`) names, for every jaxwm parameter, its Hugging Face key(s)
(per layer for the scanned ``layers`` stack) and the array layout: ``linear`` is torch
``[out, in]`` -> flax kernel ``[in, out]``; ``copy`` is unchanged (embeddings, norm scales,
relative position bias tables ``[num_buckets, num_heads]``).

The token embedding is tied in transformers: ``shared.weight`` and ``encoder.embed_tokens.weight``
name the same table; either is accepted and both are written. Original Wan checkpoints
(``blocks.0.attn.q.weight``, ...) are renamed first (:func:`original_wan_t5_to_hf_keys`).
"""

import re

import numpy as np

from jaxwm.models.umt5 import UMT5Config
from jaxwm.convert.files import open_weights, to_numpy
from jaxwm.convert.tree import get_path, set_path

EMBED_KEYS = ("shared.weight", "encoder.embed_tokens.weight")


def parameter_mapping(cfg: UMT5Config):
  """``(global_entries, layer_entries)``: lists of ``(jaxwm path, hf keys tuple, kind)``.

  Layer keys contain ``{i}``; their jaxwm arrays are stacked on axis 0 under ``layers``.
  ``cfg`` is accepted for symmetry with :mod:`jaxwm.convert.wan` (the table has no optional parts).
  """
  del cfg
  glob = [(("token_embedding", "embedding"), EMBED_KEYS, "copy"),
          (("final_norm", "scale"), ("encoder.final_layer_norm.weight",), "copy")]
  att, ff = "encoder.block.{i}.layer.0", "encoder.block.{i}.layer.1"
  layer = [(("attn_norm", "scale"), (f"{att}.layer_norm.weight",), "copy"),
           *[(("attn", n, "kernel"), (f"{att}.SelfAttention.{n}.weight",), "linear") for n in "qkvo"],
           (("attn", "rel_bias"), (f"{att}.SelfAttention.relative_attention_bias.weight",), "copy"),
           (("ffn_norm", "scale"), (f"{ff}.layer_norm.weight",), "copy"),
           *[(("ffn", n, "kernel"), (f"{ff}.DenseReluDense.{n}.weight",), "linear") for n in ("wi_0", "wi_1", "wo")]]
  return glob, layer


def _build(cfg, keys, get, leaf_dtype, put, strict):
  """Builds every leaf from ``get(key)``; ``put(path, array)`` stores it. Returns nothing; raises on gaps."""
  glob, layer = parameter_mapping(cfg)
  used, missing = set(), []

  def first(names):
    found = [k for k in names if k in keys]
    used.update(found)
    if not found:
      missing.append(names[0])
    return found[0] if found else None

  def convert(key, kind, path):
    a = np.asarray(get(key), leaf_dtype(path))
    return a.T if kind == "linear" else a

  for path, names, kind in glob:
    key = first(names)
    if key is not None:
      put(path, convert(key, kind, path))
  for path, names, kind in layer:
    per_layer = [first(tuple(n.format(i=i) for n in names)) for i in range(cfg.num_layers)]
    if None not in per_layer:
      put(("layers", *path), np.stack([convert(k, kind, ("layers", *path)) for k in per_layer]))
  if missing:
    raise KeyError(f"state dict lacks {len(missing)} key(s) the umT5 encoder needs, e.g. {missing[:5]}")
  unused = sorted(set(keys) - used)
  if strict and unused:
    raise KeyError(f"state dict has {len(unused)} key(s) no umT5 encoder parameter uses, e.g. {unused[:5]}")


def hf_to_jaxwm(state_dict, cfg: UMT5Config, strict=True):
  """A transformers ``UMT5EncoderModel`` state dict (name -> array-like) -> ``{"params": ...}`` (float32 numpy).

  Missing keys are an error; with ``strict``, so are keys no parameter uses (listed).
  """
  params = {}
  _build(cfg, set(state_dict), lambda k: to_numpy(state_dict[k]), lambda _: np.float32,
         lambda path, a: set_path(params, path, a), strict)
  return {"params": params}


def jaxwm_to_hf(variables, cfg: UMT5Config):
  """Inverse of :func:`hf_to_jaxwm`: ``{"params": ...}`` -> transformers-named numpy arrays (both embedding keys)."""
  params = variables["params"]
  glob, layer = parameter_mapping(cfg)
  out = {}
  for path, names, kind in glob:
    a = np.asarray(get_path(params, path), np.float32)
    for name in names:
      out[name] = a.T if kind == "linear" else a
  for path, names, kind in layer:
    stacked = np.asarray(get_path(params["layers"], path), np.float32)
    for i in range(cfg.num_layers):
      for name in names:
        out[name.format(i=i)] = stacked[i].T if kind == "linear" else stacked[i]
  return out


# Original Wan T5 names (wan/modules/t5.py) -> transformers names, applied in order to each key.
_ORIGINAL_RENAMES = [
    (r"^token_embedding\.weight$", "shared.weight"),
    (r"^norm\.weight$", "encoder.final_layer_norm.weight"),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.block.\1.layer.0.layer_norm."),
    (r"^blocks\.(\d+)\.attn\.([qkvo])\.", r"encoder.block.\1.layer.0.SelfAttention.\2."),
    (r"^blocks\.(\d+)\.pos_embedding\.embedding\.", r"encoder.block.\1.layer.0.SelfAttention.relative_attention_bias."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.block.\1.layer.1.layer_norm."),
    (r"^blocks\.(\d+)\.ffn\.gate\.0\.", r"encoder.block.\1.layer.1.DenseReluDense.wi_0."),
    (r"^blocks\.(\d+)\.ffn\.fc1\.", r"encoder.block.\1.layer.1.DenseReluDense.wi_1."),
    (r"^blocks\.(\d+)\.ffn\.fc2\.", r"encoder.block.\1.layer.1.DenseReluDense.wo."),
]


def original_wan_t5_key(key):
  """One original Wan umT5 key (``blocks.0.ffn.gate.0.weight``, ...) -> its transformers name."""
  for pattern, repl in _ORIGINAL_RENAMES:
    key = re.sub(pattern, repl, key)
  return key


def original_wan_t5_to_hf_keys(state_dict):
  """Renames an original Wan umT5 encoder state dict (``models_t5_umt5-xxl-enc-bf16.pth``) to transformers keys."""
  return {original_wan_t5_key(k): v for k, v in state_dict.items()}


def load_umt5_safetensors(paths, cfg: UMT5Config, abstract_params=None, shardings=None, original_names=None):
  """Loads umT5 encoder weights from safetensors file(s) leaf by leaf into (sharded) jax arrays.

  Each jaxwm leaf is assembled on the host in its target dtype (``abstract_params``' dtype, else
  ``cfg.param_dtype``) and placed with ``jax.device_put(leaf, sharding)``, so at most one leaf is
  held on the host at a time.

  Args:
    paths: a path or a list of paths: safetensors files, ``torch.save`` state dicts (``.pth``: the release's
      ``models_t5_umt5-xxl-enc-bf16.pth``), or folders whose ``*.safetensors`` files are all read (e.g. a
      diffusers ``text_encoder/`` folder).
    cfg: the encoder config the weights must fit.
    abstract_params: optional ``jax.eval_shape`` of the init (boxed or not) to check shapes and dtypes.
    shardings: optional pytree of ``jax.sharding.Sharding`` matching ``{"params": ...}``.
    original_names: force (True/False) or auto-detect (None) original Wan key names.

  Returns:
    ``{"params": ...}`` of jax arrays.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  paths = [paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else list(paths)
  paths = [q for p in map(os.fspath, paths) for q in (
      [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.endswith(".safetensors")] if os.path.isdir(p) else [p])]
  if not paths:
    raise ValueError("paths: no safetensors file given (an empty list or folder)")
  where = {}
  for p in paths:
    f = open_weights(p)
    for k in f.header:
      where[k] = (f, k)
  if original_names or (original_names is None and any(k.startswith("blocks.") for k in where)):
    where = {original_wan_t5_key(k): v for k, v in where.items()}
  abstract = None if abstract_params is None else nn.meta.unbox(abstract_params)
  params = {}

  def leaf_dtype(path):
    return cfg.params_dtype if abstract is None else get_path(abstract["params"], path).dtype

  def put(path, a):
    if abstract is not None and tuple(get_path(abstract["params"], path).shape) != a.shape:
      raise ValueError(f"checkpoint parameter {'/'.join(path)} has shape {a.shape}; the model expects "
                       f"{tuple(get_path(abstract['params'], path).shape)}")
    sharding = None if shardings is None else get_path(shardings["params"], path)
    set_path(params, path, jax.device_put(a, sharding))

  _build(cfg, set(where), lambda k: where[k][0].get(where[k][1]), leaf_dtype, put, strict=True)
  return {"params": params}
