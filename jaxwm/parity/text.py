"""Parity of the umT5 text encoder: the user's weights in transformers' ``UMT5EncoderModel`` and in jaxwm's
``UMT5Encoder``, on the same seeded random token ids (each sample padded to a different length).

Compared: the token embedding, every layer's output, the final (normed) output on the real tokens; then the
gradients of ``L = mean(out * r * mask)`` with respect to every parameter group (per layer: ``attn``, the
self-attention with its norm and relative position bias, and ``ffn``; the embedding; the final norm). Token ids are
integers, so there is no input gradient.
"""

import json
import pathlib
import re

import numpy as np

from jaxwm.parity.reference import bfloat16_twin, load_reference, quiet, round_weights
from jaxwm.parity.report import TOLERANCE, Report, group_gradients


def _group(name):
  m = re.match(r"encoder\.block\.(\d+)\.layer\.([01])\.", name)
  if m:
    return f"block.{m.group(1)}.{'attn' if m.group(2) == '0' else 'ffn'}"
  return "embedding" if name in ("shared.weight", "encoder.embed_tokens.weight") else "final_layer_norm"


def load(path, dtype, config=None):
  """``(torch model, UMT5Config, jaxwm variables)``. ``path``: a transformers ``text_encoder/`` folder (its
  ``config.json`` and weights) or a weights file (the release's ``models_t5_umt5-xxl-enc-bf16.pth``, original
  names renamed); ``config``: a ``config.json`` path for a file without one beside it (default: umT5-XXL)."""
  import transformers  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.files import read_state_dict  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.umt5 import hf_to_jaxwm, original_wan_t5_to_hf_keys  # pylint: disable=g-import-not-at-top
  from jaxwm.models.umt5 import UMT5Config  # pylint: disable=g-import-not-at-top
  p = pathlib.Path(path)
  cfg_file = pathlib.Path(config) if config else (p if p.is_dir() else p.parent) / "config.json"
  if cfg_file.is_file():
    hf = transformers.UMT5Config(**json.loads(cfg_file.read_text()))
  else:
    hf = transformers.UMT5Config(**{f: getattr(UMT5Config.xxl(), f) for f in (
        "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
        "relative_attention_max_distance", "feed_forward_proj", "layer_norm_epsilon")})
  hf.dropout_rate = 0.0
  cfg = UMT5Config.from_hf(hf, dtype=dtype)
  files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
  sd = read_state_dict(files)
  if any(k.startswith("blocks.") for k in sd):
    sd = original_wan_t5_to_hf_keys(sd)
  sd = round_weights(sd, dtype)
  if "shared.weight" not in sd and "encoder.embed_tokens.weight" in sd:
    sd = {**sd, "shared.weight": sd["encoder.embed_tokens.weight"]}
  tm = load_reference(transformers.UMT5EncoderModel(hf), sd, path, allow_missing=("encoder.embed_tokens.weight",))
  return tm, cfg, hf_to_jaxwm(sd, cfg)


def inputs(cfg, text_len, batch, seed):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, cfg.vocab_size, size=(batch, text_len)).astype(np.int32)
  lengths = np.maximum(1, text_len - np.arange(batch) * max(1, text_len // 4))
  mask = (np.arange(text_len)[None] < lengths[:, None]).astype(np.int32)
  return {"ids": ids, "mask": mask, "r": rng.normal(size=(batch, text_len, cfg.d_model)).astype(np.float32)}


def _torch_run(tm, inp):
  import torch  # pylint: disable=g-import-not-at-top
  acts = {}
  hooks = [tm.encoder.embed_tokens.register_forward_hook(lambda _m, _i, o: acts.__setitem__("token_embedding",
                                                                              o.detach().float().numpy()))]
  hooks += [b.register_forward_hook(lambda _m, _i, o, i=i: acts.__setitem__(
      f"block.{i}", (o[0] if isinstance(o, tuple) else o).detach().float().numpy()))
            for i, b in enumerate(tm.encoder.block)]
  tm.zero_grad(set_to_none=True)
  out = tm(input_ids=torch.as_tensor(inp["ids"], dtype=torch.long),
           attention_mask=torch.as_tensor(inp["mask"], dtype=torch.long)).last_hidden_state
  m = torch.as_tensor(inp["mask"], dtype=torch.float32)[..., None]
  (out.float() * torch.tensor(inp["r"]) * m).mean().backward()
  for h in hooks:
    h.remove()
  grads = {k: p.grad.float().numpy() for k, p in tm.named_parameters() if p.grad is not None}
  return acts, out.detach().float().numpy(), grads


def _jax_run(cfg, variables, inp):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.umt5 import jaxwm_to_hf  # pylint: disable=g-import-not-at-top
  from jaxwm.models.umt5 import UMT5Encoder  # pylint: disable=g-import-not-at-top
  model = UMT5Encoder(cfg)
  ids, mask = jnp.asarray(inp["ids"]), jnp.asarray(inp["mask"])

  def forward(v):
    out, state = model.apply(v, ids, mask, mutable=["intermediates"],
                             capture_intermediates=lambda m, _: m.name in ("token_embedding", "layers"))
    return out, state["intermediates"]

  def loss(v):
    return jnp.mean(forward(v)[0] * inp["r"] * mask[..., None])

  v = jax.tree_util.tree_map(jnp.asarray, variables)
  out, inter = jax.jit(forward)(v)
  grads = jax.jit(jax.grad(loss))(v)
  acts = {"token_embedding": np.asarray(inter["token_embedding"]["__call__"][0], np.float32)}
  stacked = inter["layers"]["__call__"][0][0]  # [layers, B, L, D]
  acts.update({f"block.{i}": np.asarray(stacked[i], np.float32) for i in range(cfg.num_layers)})
  grads = jaxwm_to_hf(jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), grads), cfg)
  return acts, np.asarray(out, np.float32), grads


def check(path, *, text_len=8, batch=2, dtype="float32", seed=0, tol=None, config=None):
  """The text encoder's :class:`jaxwm.parity.report.Report`; outputs are compared on the real tokens only."""
  quiet()
  tm, cfg, variables = load(path, dtype, config)
  inp = inputs(cfg, text_len, batch, seed)
  ref = dict(zip(("acts", "out", "grads"), _torch_run(tm, inp)))
  peer = dict(zip(ref, _torch_run(bfloat16_twin(tm), inp))) if dtype == "bfloat16" else None
  ours = dict(zip(ref, _jax_run(cfg, variables, inp)))
  rep = Report(meta={"model": "text_encoder", "weights": str(path), "layers": cfg.num_layers, "d_model": cfg.d_model,
                     "tokens": f"{batch}x{text_len}", "dtype": dtype, "seed": seed},
               tol=TOLERANCE[dtype] if tol is None else tol)
  real = inp["mask"].astype(bool)
  for name in ref["acts"]:
    rep.add("activation", name, ours["acts"][name][real], ref["acts"][name][real],
            None if peer is None else peer["acts"][name][real])
  rep.add("output", "last_hidden_state", ours["out"][real], ref["out"][real],
          None if peer is None else peer["out"][real])
  group_gradients(rep, {k: ours["grads"][k] for k in ref["grads"]}, ref["grads"], _group,
                  None if peer is None else peer["grads"])
  return rep
