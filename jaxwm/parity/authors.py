"""The authors' own PyTorch transformer (``wan/modules/model.py`` of a Wan2.2 checkout) as the parity reference
(``jaxwm-parity transformer ... --wan-code <checkout>``).

The modules are loaded by path (``wan/modules/model.py`` and ``attention.py`` as a package of their own), so
``wan/__init__.py`` and its pipelines' dependencies are never imported. Their ``flash_attention`` needs a CUDA GPU
with flash-attn; on this host it is replaced by :func:`sdpa_attention`, torch's ``scaled_dot_product_attention``
with the same arguments and meaning (keys beyond ``k_lens`` masked, queries beyond ``q_lens`` zero), in the
inputs' dtype rather than flash-attn's bfloat16.
"""

import importlib.machinery
import importlib.util
import pathlib
import sys

import numpy as np

PACKAGE = "jaxwm_parity_wan_modules"


def sdpa_attention(q, k, v, q_lens=None, k_lens=None, dropout_p=0.0, softmax_scale=None, q_scale=None, causal=False,
                   window_size=(-1, -1), deterministic=False, dtype=None, version=None):
  """``wan.modules.attention.flash_attention``'s contract on any device: ``q [B, Lq, N, C]``, ``k, v [B, Lk, N, C]``
  -> ``[B, Lq, N, C]`` in ``q``'s dtype. Dropout, causal and windowed attention (unused by the released models'
  forward) are refused."""
  del deterministic, dtype, version
  import torch  # pylint: disable=g-import-not-at-top
  if dropout_p or causal or tuple(window_size) != (-1, -1):
    raise ValueError(f"the authors' attention with dropout_p={dropout_p}, causal={causal}, window_size={window_size}: "
                     "only dense attention is compared")
  if q_scale is not None:
    q = q * q_scale
  mask = None
  if k_lens is not None:
    mask = (torch.arange(k.shape[1])[None, :] < k_lens.to(torch.long)[:, None])[:, None, None, :]
  out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).to(q.dtype),
                                                         v.transpose(1, 2).to(q.dtype), attn_mask=mask,
                                                         scale=softmax_scale).transpose(1, 2)
  if q_lens is not None:
    keep = torch.arange(q.shape[1])[None, :] < q_lens.to(torch.long)[:, None]
    out = out * keep[:, :, None, None]
  return out.type(q.dtype)


def load_modules(code):
  """The authors' ``model`` module from the checkout ``code`` (a folder with ``wan/modules/model.py``), its
  ``flash_attention`` replaced by :func:`sdpa_attention`. A one-line ``ValueError`` when it is not there."""
  folder = pathlib.Path(code).expanduser() / "wan" / "modules"
  if not (folder / "model.py").is_file() or not (folder / "attention.py").is_file():
    raise ValueError(f"--wan-code={str(code)!r}: no wan/modules/model.py and attention.py under it (a checkout of "
                     "github.com/Wan-Video/Wan2.2)")
  if PACKAGE not in sys.modules:
    pkg = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True))
    pkg.__path__ = [str(folder)]
    sys.modules[PACKAGE] = pkg
  mods = {}
  for name in ("attention", "model"):
    full = f"{PACKAGE}.{name}"
    if full not in sys.modules:
      spec = importlib.util.spec_from_file_location(full, folder / f"{name}.py")
      mod = importlib.util.module_from_spec(spec)
      sys.modules[full] = mod
      spec.loader.exec_module(mod)
    mods[name] = sys.modules[full]
  mods["model"].flash_attention = sdpa_attention
  return mods["model"]


def build(code, kwargs, text_len, sd, path):
  """The authors' ``WanModel`` (float32) for diffusers' ``kwargs`` (:func:`jaxwm.convert.wan.transformer_config`),
  a context of ``text_len`` tokens, with ``sd`` (diffusers names) loaded under the authors' names. Every module
  key must be found and every weight used (one-line ``ValueError`` naming ``path``)."""
  import torch  # pylint: disable=g-import-not-at-top
  from jaxwm.convert.wan import original_wan_to_diffusers_keys  # pylint: disable=g-import-not-at-top
  model_lib = load_modules(code)
  heads = kwargs["num_attention_heads"]
  tm = model_lib.WanModel(model_type="t2v", patch_size=tuple(kwargs["patch_size"]), text_len=text_len,
                          in_dim=kwargs["in_channels"], dim=heads * kwargs["attention_head_dim"],
                          ffn_dim=kwargs["ffn_dim"], freq_dim=kwargs["freq_dim"], text_dim=kwargs["text_dim"],
                          out_dim=kwargs["out_channels"], num_heads=heads, num_layers=kwargs["num_layers"],
                          cross_attn_norm=kwargs["cross_attn_norm"], eps=kwargs["eps"])
  names = {k: original_wan_to_diffusers_keys({k: None}).popitem()[0] for k in tm.state_dict()}
  missing = [k for k, d in names.items() if d not in sd]
  unused = sorted(set(sd) - set(names.values()))
  if missing or unused:
    raise ValueError(f"{path}: the weights do not fit the authors' WanModel: missing {missing[:3]}, unused "
                     f"{unused[:3]}")
  tm.load_state_dict({k: torch.from_numpy(np.array(sd[d], np.float32)) for k, d in names.items()}, strict=True)
  return tm.float().eval(), names


def run(tm, names, inp, patch_size):
  """Activations (named as diffusers' modules), output and gradients (diffusers names) of the authors' model on
  :func:`jaxwm.parity.transformer.inputs` (numpy float32, channels-last, token-major)."""
  import torch  # pylint: disable=g-import-not-at-top
  acts, patches = {}, []

  def keep(name):
    return lambda _m, _i, out: acts.__setitem__(name, out.detach().float().numpy())

  hooks = [tm.patch_embedding.register_forward_hook(
      lambda _m, _i, out: patches.append(out.detach().flatten(2).transpose(1, 2).float().numpy())),
           tm.text_embedding.register_forward_hook(keep("text_embedder"))]
  hooks += [b.register_forward_hook(keep(f"blocks.{i}")) for i, b in enumerate(tm.blocks)]
  x = torch.tensor(inp["x"]).permute(0, 4, 1, 2, 3).contiguous().requires_grad_(True)  # [B, C, F, H, W]
  ctx = torch.tensor(inp["ctx"]).requires_grad_(True)
  f, h, w = x.shape[2:]
  seq_len = (f // patch_size[0]) * (h // patch_size[1]) * (w // patch_size[2])
  tm.zero_grad(set_to_none=True)
  t = torch.tensor(inp["t"])[:, None].expand(-1, seq_len)  # per token, as the TI2V pipeline passes it
  out = torch.stack(tm(list(x.unbind(0)), t, list(ctx.unbind(0)), seq_len))
  out = out.permute(0, 2, 3, 4, 1)
  (out * torch.tensor(inp["r"])).mean().backward()
  for hk in hooks:
    hk.remove()
  acts["patch_embedding"] = np.concatenate(patches)
  grads = {names[k]: p.grad.float().numpy() for k, p in tm.named_parameters()}
  return acts, out.detach().numpy(), x.grad.permute(0, 2, 3, 4, 1).numpy(), ctx.grad.numpy(), grads
