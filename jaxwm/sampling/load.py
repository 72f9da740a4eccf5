"""Loading a trained model from an Orbax checkpoint directory (for ``sample.py`` and notebooks)."""

import pathlib

import ml_collections


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


def load_model(path, step=None, use_ema=True):
  """Restores ``(config, model, variables, step)`` from a checkpoint written by ``train.py``.

  Raises ``FileNotFoundError`` with the command that makes one when there is none.
  """
  from jaxwm.training.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  from jaxwm.training.loop import Trainer  # pylint: disable=g-import-not-at-top
  ckpt_dir, found_step = find_checkpoint_dir(path)
  if not ckpt_dir.is_dir():
    raise FileNotFoundError(f"no checkpoint at {path}: train one with `python train.py` "
                            "(it writes runs/tiny/checkpoints), then pass --workdir runs/tiny")
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  step = step if step is not None else found_step if found_step is not None else ckpt.latest_step()
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: train one with `python train.py` "
                            "(it writes runs/tiny/checkpoints), then pass --workdir runs/tiny")
  config = ml_collections.ConfigDict(ckpt.restore_config(step))
  config.model.patch_size = tuple(config.model.patch_size)
  config.mesh.data, config.mesh.fsdp = -1, 1
  trainer = Trainer(config, ckpt_dir.parent)
  state, step = ckpt.restore(trainer.restore_target(), step=step)
  ckpt.close()
  params = state.ema if (use_ema and state.ema) else state.params
  return config, trainer.model, {"params": params}, step
