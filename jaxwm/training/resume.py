"""Restore-or-init, shared by every task: the newest intact checkpoint, its saved config compared with the run's
(another model is refused in one line, changed settings are said), or a fresh state.

Which keys may change on resume is field metadata (:func:`resume_rules`): every block field says ``refused``,
``logged`` (said in one line) or ``free`` (:func:`jaxwm.settings.setting`); model fields are refused but those
marked :data:`jaxwm.models.config.RUNTIME` (how the model is computed, not what). Two rules depend on values:
``recipe.head_windows.pool`` is refused while windows are on, ``optim.ema_decay`` when EMA turns on or off. A
task adds its own keys with ``extra`` (distillation: the LoRA shape and the teacher step).
"""

import dataclasses

import functools

from jaxwm import checkpoint as ckpt_lib
from jaxwm import settings
from jaxwm.models.config import ModelConfig
from jaxwm.training.workdir import RunRefusedError
from jaxwm.training.writers import say

ABSENT = "<absent>"


@functools.lru_cache(maxsize=1)
def resume_rules():
  """``{dotted key: refused | logged | free}`` of every block field, the model's and ``seed`` (logged)."""
  from jaxwm.blocks import BLOCKS  # pylint: disable=g-import-not-at-top
  rules = {"seed": "logged", **settings.resume_rules(ModelConfig, "model")}
  for block in BLOCKS.values():
    rules.update(settings.resume_rules(block))
  return rules


class ResumeConfigError(RunRefusedError, ValueError):
  """The config's model (or a parameter-shaping setting) differs from the checkpoint's."""


def flat(d, prefix=""):
  """``{"a.b.c": value}`` of nested dicts; lists become tuples."""
  out = {}
  for k, v in (d.items() if hasattr(d, "items") else []):
    key = f"{prefix}{k}"
    if hasattr(v, "items"):
      out.update(flat(v, key + "."))
    else:
      out[key] = _tuples(v)
  return out


def _tuples(v):
  return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


def _model_flat(block):
  """Flat ``model.*`` with the dataclass defaults filled in (the raw block if it does not parse)."""
  try:
    block = dict(block)
    if "patch_size" in block:
      block["patch_size"] = tuple(block["patch_size"])
    return flat(dataclasses.asdict(ModelConfig.from_dict(block)), "model.")
  except (ValueError, TypeError, KeyError):
    return flat(block, "model.")


def _normalised(config):
  """``config`` (a dict) with each block read by its dataclass, a key it lacks filled with what its absence meant
  then (a saved config without ``recipe.layout`` was teacher forcing); a block that does not parse stays as it is."""
  from jaxwm.blocks import BLOCKS  # pylint: disable=g-import-not-at-top
  out = dict(config)
  for prefix, cls in BLOCKS.items():
    if hasattr(out.get(prefix), "items"):
      try:
        out[prefix] = cls.from_dict(out[prefix], legacy=True).to_dict()
      except (ValueError, TypeError):
        pass
  return out


def resume_config_differences(saved, config):
  """Compares a checkpoint's saved config with the config of a run resuming it.

  Args:
    saved: the checkpoint's config (a dict, as saved).
    config: the run's config (``ConfigDict`` or dict).

  Returns:
    ``(refused, logged)``: lists of ``(key, checkpoint value, config value)`` by :func:`resume_rules` (a model
    key it does not know is refused, any other unknown key ignored), the head-routing pool while windows are
    on and EMA on/off refused (they shape the train state).
  """
  cur = _normalised(config.to_dict() if hasattr(config, "to_dict") else dict(config))
  saved = _normalised(saved)
  a = {**flat({k: v for k, v in saved.items() if k != "model"}), **_model_flat(saved.get("model", {}))}
  b = {**flat({k: v for k, v in cur.items() if k != "model"}), **_model_flat(cur.get("model", {}))}
  rules = resume_rules()
  refused, logged = [], []
  for key in sorted(set(a) | set(b)):
    va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
    if va == vb:
      continue
    rule = rules.get(key, "refused" if key.startswith("model.") else "free")
    if key == "recipe.head_windows.pool" and (a.get("recipe.head_windows.enabled") or b.get(
        "recipe.head_windows.enabled")):
      rule = "refused"
    elif key == "optim.ema_decay" and va != ABSENT and vb != ABSENT and (va > 0) != (vb > 0):
      rule = "refused"  # EMA on/off: the train state has (no) ema
    if rule == "refused":
      refused.append((key, va, vb))
    elif rule == "logged":
      logged.append((key, va, vb))
  return refused, logged


def fmt(v):
  return repr(v) if isinstance(v, str) and v != ABSENT else str(v)


def check_resume_config(ckpt, step, config, *, extra=None, require_saved=False,
                        advice="train in a new --workdir (train.init_from=<this workdir> starts from its parameters)",
                        what="another model"):
  """Refuses (:class:`ResumeConfigError`, one line naming every differing key) a resume of ``step`` whose saved
  config differs in a refused key; says each logged change in one line.

  ``extra(saved, config) -> (refused, logged)`` adds a task's own keys. Without a readable saved config the
  model is not compared (a note), or the resume is refused when ``require_saved`` (the reason, said in the
  refusal). Returns the saved config.
  """
  try:
    saved = ckpt.restore_config(step)
  except Exception as e:  # pylint: disable=broad-except
    if require_saved:
      raise ResumeConfigError(f"checkpoint step {step} in {ckpt.directory} has no readable config "
                              f"({type(e).__name__}): {require_saved}") from None
    say(f"note: checkpoint step {step} has no readable config ({type(e).__name__}); the model is not compared")
    return None
  refused, logged = resume_config_differences(saved, config)
  if extra is not None:
    more_refused, more_logged = extra(saved, config)
    refused, logged = refused + list(more_refused), logged + list(more_logged)
  if refused:
    diffs = "; ".join(f"{k}: {fmt(va)} (checkpoint) != {fmt(vb)}" for k, va, vb in refused)
    raise ResumeConfigError(f"cannot resume {ckpt.directory} step {step} with {what}: {diffs}. Resume with the "
                            f"checkpoint's values, or {advice}")
  for k, va, vb in logged:
    say(f"config changed since checkpoint step {step}: {k}: {fmt(va)} -> {fmt(vb)}")
  return saved


def restore_or_init(ckpt, target, data_iter, *, check, init):
  """``(state, start)``: the newest intact checkpoint of ``ckpt`` restored into ``target`` (with the data
  iterator; ``check(step)`` runs before any array is read), or ``(init(), 0)`` when there is none. A checkpoints
  directory with no intact step raises :class:`RunRefusedError` (one line)."""
  if not ckpt.all_steps():
    return init(), 0
  try:
    state, start = ckpt.restore(target, data_iter, check=check)
  except ckpt_lib.DamagedCheckpointError as e:
    raise RunRefusedError(str(e)) from None
  say(f"resumed from step {start} in {ckpt.directory}")
  return state, start
