"""Between one stack of all layers (``params["blocks"]``, leading axis ``num_layers``: diffusers
conversions, LOCI checkpoints written before layers were grouped) and the model's runs of
identical layers (``ModelConfig.layer_groups``: ``blocks`` or ``blocks_<start>_<end>``)."""

import jax
import jax.numpy as jnp


def group_name(cfg, start, end):
  """The parameter name of the stack of layers ``[start, end)``."""
  return "blocks" if len(cfg.layer_groups) == 1 else f"blocks_{start}_{end}"


def split_layers(params, cfg, fill=None):
  """``params`` with one ``blocks`` stack of ``num_layers`` -> the model's grouped stacks.

  Softmax layers drop LOCI memory parameters (``memory``, ``mem_gate``) the stack may carry;
  hybrid layers take the ones the stack lacks from ``fill`` (parameters of the target model, e.g. a
  fresh init), or raise ``ValueError`` naming the missing key.
  """
  if len(cfg.layer_groups) == 1:
    return params
  stack = params["blocks"]
  out = {k: v for k, v in params.items() if k != "blocks"}
  for kind, lo, hi in cfg.layer_groups:
    name = group_name(cfg, lo, hi)
    group = {k: jax.tree_util.tree_map(lambda a, lo=lo, hi=hi: a[lo:hi], v) for k, v in stack.items()
             if kind == "hybrid" or k not in ("memory", "mem_gate")}
    if kind == "hybrid":
      for k in ("memory", "mem_gate"):
        if k not in group:
          if fill is None:
            raise ValueError(f"layers [{lo}, {hi}) are LOCI hybrid blocks: the parameter stack has no {k!r}; "
                             "pass fill= (e.g. freshly initialised parameters) to take it from there")
          group[k] = fill[name][k]
    out[name] = group
  return out


def join_layers(params, cfg):
  """Inverse of :func:`split_layers` for the shared block parameters: one ``blocks`` stack of all layers
  (memory parameters of hybrid layers are left out, as in the pretrained backbone)."""
  if len(cfg.layer_groups) == 1:
    return params
  out = {k: v for k, v in params.items() if not k.startswith("blocks_")}
  groups = [params[group_name(cfg, lo, hi)] for _, lo, hi in cfg.layer_groups]
  shared = [{k: v for k, v in g.items() if k not in ("memory", "mem_gate")} for g in groups]
  out["blocks"] = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *shared)
  return out
