"""Loading a trained model from an Orbax checkpoint directory (``sample.py``, notebooks, evaluation,
``train.init_from``): the config saved with the checkpoint, the model it describes, and its
parameters (or their EMA) restored alone, never the optimizer state.

Without an explicit step, the newest intact step is loaded: each damaged newer step is named with
its reason in one line on stderr and left in place (:mod:`jaxwm.checkpoint`). An explicit step that
is damaged raises :class:`jaxwm.checkpoint.DamagedCheckpointError` (a ``FileNotFoundError``).
"""

import pathlib

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxwm.checkpoint import Checkpointer, abstract_with_shardings
from jaxwm.models.config import ModelConfig
from jaxwm.models.init import init_params
from jaxwm.models.transformer import WanModel

_NO_CHECKPOINT = "train one with `python train.py` (it writes runs/tiny/checkpoints), then pass --workdir runs/tiny"


def find_checkpoint_dir(path):
  """``path`` may be a workdir (with ``checkpoints/``), a checkpoints directory, or one step's directory.

  Returns:
    ``(checkpoints_dir, step or None)``.
  """
  p = pathlib.Path(path)
  if (p / "checkpoints").is_dir():
    return p / "checkpoints", None
  if p.name.isdigit() and (p / "state").is_dir():
    return p.parent, int(p.name)
  return p, None


def _load(path, step, attempt):
  """``(attempt(ckpt, step), step)`` on the given step (argument, or ``path``'s step directory) or else
  the newest intact step of ``path`` (see :func:`find_checkpoint_dir`); damaged steps are reported."""
  ckpt_dir, found_step = find_checkpoint_dir(path)
  if not ckpt_dir.is_dir():
    raise FileNotFoundError(f"no checkpoint at {path}: {_NO_CHECKPOINT}")
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    if not ckpt.all_steps():
      raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: {_NO_CHECKPOINT}")
    step = step if step is not None else found_step
    return ckpt.restore_with(lambda s: attempt(ckpt, s), step, user_errors=(ParamTreeError,))
  finally:
    ckpt.close()


def _config(ckpt, step):
  config = ml_collections.ConfigDict(ckpt.restore_config(step))
  config.model.patch_size = tuple(config.model.patch_size)
  return config


def load_config(path, step=None):
  """The ``ConfigDict`` saved with a checkpoint (``path`` as in :func:`find_checkpoint_dir`; the
  newest intact step by default)."""
  return _load(path, step, _config)[0]


def abstract_params(model, config):
  """Unboxed ``jax.ShapeDtypeStruct`` tree of ``model``'s parameters (nothing allocated).

  Built by ``jax.eval_shape`` of :func:`jaxwm.models.init.init_params` on latents
  ``[1, S, h, w, C]``: ``C = model.in_channels``, ``h = w = image_size // latent_stride`` of rendered frames
  (two patches for ingested latents, whose dataset a sampling session may not have), ``S = 2``
  (parameters depend on neither ``S`` nor the grid).
  """
  d = config.data
  if d.get("source") == "records":
    hw = 2 * max(model.cfg.patch_size[1:])
  else:
    hw = d.image_size // d.latent_stride
  shape = (1, 2, hw, hw, model.cfg.in_channels)
  boxed = jax.eval_shape(lambda key: init_params(model, key, shape, d.image_size), jax.random.key(0))
  return nn.unbox(boxed)


def _flat(tree):
  """``{"a/b/c": leaf}`` of a nested-dict tree (leaves: arrays, shape structs or Orbax metadata)."""
  leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
  return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in kp): v for kp, v in leaves}


class ParamTreeError(ValueError):
  """A checkpoint's parameters are not those of the model (a presence or shape differs)."""


def check_param_tree(saved, target, where):
  """Raises a one-line :class:`ParamTreeError` naming the first parameter whose presence or shape differs.

  Args:
    saved: the checkpoint's parameter metadata tree (leaves with ``.shape``).
    target: the model's abstract parameter tree.
    where: what ``saved`` is, for the message.
  """
  saved, target = _flat(saved), _flat(target)
  for key, t in target.items():
    if key not in saved:
      raise ParamTreeError(f"{where}: parameter {key} of the model is not in the checkpoint "
                           f"(checkpoint parameters: {len(saved)}, the model's: {len(target)})")
    if tuple(saved[key].shape) != tuple(t.shape):
      raise ParamTreeError(f"{where}: parameter {key} has shape {tuple(saved[key].shape)}, the model's is "
                           f"{tuple(t.shape)}")
  extra = [k for k in saved if k not in target]
  if extra:
    raise ParamTreeError(f"{where}: parameter {extra[0]} is not in the model ({len(extra)} checkpoint "
                         "parameter(s) the model lacks)")


def restore_params(path, target, step=None, use_ema=True):
  """Restores only the parameters (or their EMA) of a checkpoint into ``target``'s shardings.

  Args:
    path: a workdir, checkpoints directory or step directory (:func:`find_checkpoint_dir`).
    target: ``jax.ShapeDtypeStruct`` tree (with shardings) of the model's parameters.
    step: the checkpoint step (default: ``path``'s step or the newest intact one).
    use_ema: restore ``ema`` instead of ``params`` when the checkpoint kept a non-empty EMA.

  Returns:
    ``(params, step, field)``: arrays shaped and sharded like ``target``; ``field`` is ``"params"``
    or ``"ema"``. Raises ``ValueError`` (one line, naming the first differing parameter) when the
    checkpoint's parameter tree differs from ``target``, ``FileNotFoundError`` when there is no
    checkpoint (:class:`jaxwm.checkpoint.DamagedCheckpointError` when it is damaged).
  """
  (params, field), step = _load(path, step, lambda ckpt, s: _restore_params(ckpt, s, target, use_ema))
  return params, step, field


def _restore_params(ckpt, step, target, use_ema):
  meta = ckpt.state_metadata(step)
  field = "ema" if use_ema and jax.tree_util.tree_leaves(meta.get("ema") or {}) else "params"
  legacy = _one_stack_target(meta[field], target)
  check_param_tree(meta[field], target if legacy is None else legacy, f"{ckpt.directory} step {step} ({field})")
  params = ckpt.restore_fields({field: target if legacy is None else legacy}, step)[field]
  return (params if legacy is None else _split_stack(params, target)), field


def _groups(target):
  """``[(name, start, end)]`` of the model's grouped layer stacks ``blocks_<start>_<end>``."""
  return sorted(((k, *map(int, k.split("_")[1:])) for k in target if k.startswith("blocks_")), key=lambda g: g[1])


def _one_stack_target(saved, target):
  """For a LOCI checkpoint written before layers were grouped (one ``blocks`` stack, memory parameters in
  every layer) the restore target of that layout; None when the checkpoint has the model's layout."""
  groups = _groups(target)
  if "blocks" not in saved or "blocks" in target or not groups:
    return None
  hybrid = next((target[name] for name, _, _ in groups if "memory" in target[name]), None)
  if hybrid is None:
    return None
  n = groups[-1][2]
  stack = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((n,) + a.shape[1:], a.dtype, sharding=a.sharding),
                                 hybrid)
  return {**{k: v for k, v in target.items() if not k.startswith("blocks_")}, "blocks": stack}


def _split_stack(params, target):
  """One ``blocks`` stack -> the model's grouped stacks (softmax layers drop the memory they carried)."""
  out = {k: v for k, v in params.items() if k != "blocks"}
  for name, lo, hi in _groups(target):
    out[name] = {k: jax.tree_util.tree_map(lambda a, lo=lo, hi=hi: a[lo:hi], v)
                 for k, v in params["blocks"].items() if k in target[name]}
  return out


def load_model(path, step=None, use_ema=True, mesh=None, shardings=None):
  """Restores ``(config, model, variables, step)`` from a checkpoint written by ``train.py``.

  Only the parameters (the EMA when ``use_ema`` and kept) are read; ``variables = {"params": ...}``.

  Args:
    path: a workdir, checkpoints directory or step directory (:func:`find_checkpoint_dir`).
    step: the checkpoint step (default: ``path``'s step or the newest intact one).
    use_ema: prefer the EMA parameters when the checkpoint has them.
    mesh: parameters are replicated over this mesh (default: a 1-device mesh of
      ``jax.devices()[:1]``).
    shardings: a ``jax.sharding.Sharding`` for every parameter, or a tree of them shaped like
      the parameters; overrides ``mesh``.

  Raises ``FileNotFoundError`` with the command that makes one when there is none,
  :class:`jaxwm.checkpoint.DamagedCheckpointError` when ``step`` (or every step) is damaged.
  """

  def attempt(ckpt, step):
    config = _config(ckpt, step)
    model = WanModel(ModelConfig.from_dict(config.model))
    abstract = abstract_params(model, config)
    sh = shardings
    if sh is None:
      m = mesh if mesh is not None else Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
      sh = NamedSharding(m, P())  # axis names as in training's (data, fsdp) meshes
    if isinstance(sh, jax.sharding.Sharding):
      sh = jax.tree_util.tree_map(lambda _, s=sh: s, abstract)
    params, _ = _restore_params(ckpt, step, abstract_with_shardings(abstract, sh), use_ema)
    return config, model, params

  (config, model, params), step = _load(path, step, attempt)
  return config, model, {"params": params}, step
