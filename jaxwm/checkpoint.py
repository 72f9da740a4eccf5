"""Orbax checkpoints: train state (restored into the current mesh's shardings), data-iterator
state and config, written atomically (a temporary directory renamed on completion), async
where available, keeping the newest ``keep``.

A step's directory ``<directory>/<step>/`` holds the composite items ``state`` (the train state:
``step``, ``params``, ``opt_state``, ``ema``, ``routing``), ``data`` and ``config``. Loading for
inference reads single fields of ``state`` (:meth:`Checkpointer.restore_fields`), never the
optimizer state.
"""

import json
import logging
import pathlib

import grain.python as grain
import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores ``{state, data, config}`` under ``directory/<step>``."""

  def __init__(self, directory, keep=3, async_save=True):
    self.directory = pathlib.Path(directory).absolute()  # orbax needs absolute paths
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.PyGrainCheckpointHandler(),
                       "config": ocp.JsonCheckpointHandler()},
    )

  def latest_step(self):
    return self.manager.latest_step()

  def all_steps(self):
    return list(self.manager.all_steps())

  def save(self, step, state, data_iterator=None, config=None):
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items["data"] = grain.PyGrainCheckpointSave(data_iterator)
    if config is not None:
      items["config"] = ocp.args.JsonSave(json.loads(config.to_json()) if hasattr(config, "to_json") else config)
    self.manager.save(int(step), args=ocp.args.Composite(**items))
    logging.info("checkpoint of step %d requested in %s", step, self.directory)

  def restore(self, abstract_state, data_iterator=None, step=None):
    """Restores into ``abstract_state`` (a pytree of ``jax.ShapeDtypeStruct`` with shardings).

    Returns:
      ``(state, step)``; ``data_iterator`` (if given) is advanced to its saved position.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.PyGrainCheckpointRestore(data_iterator)
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except ValueError as e:
      # Checkpoints written before TrainState.routing existed: restore the other fields, routing stays {}.
      if "routing" not in str(e) or getattr(abstract_state, "routing", None) != {}:
        raise
      legacy = {k: getattr(abstract_state, k) for k in ("step", "params", "opt_state", "ema")}
      items["state"] = ocp.args.StandardRestore(legacy)
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      logging.info("restored a checkpoint without head-routing state (written before it existed)")
      return abstract_state.replace(**restored["state"]), step
    return restored["state"], step

  def restore_config(self, step=None):
    step = self.latest_step() if step is None else step
    return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]

  def _state_dir(self, step):
    path = self.directory / str(int(step)) / "state"
    if not path.is_dir():
      raise FileNotFoundError(f"no train state of step {step} in {self.directory}; steps: {self.all_steps()}")
    return path

  def state_metadata(self, step):
    """Nested dict of the saved train state's fields (``params``, ``ema``, ...) with array metadata
    leaves (``.shape``, ``.dtype``); nothing is read but the metadata file."""
    return ocp.PyTreeCheckpointHandler().metadata(self._state_dir(step)).tree

  def restore_fields(self, targets, step):
    """Restores only the train-state fields named in ``targets`` (Orbax partial restore).

    Args:
      targets: ``{field: tree of jax.ShapeDtypeStruct with shardings}``, e.g. ``{"params": ...}``;
        every other field (``opt_state``, ...) is left on disk, unread.
      step: the checkpoint step.

    Returns:
      ``{field: tree of jax.Array}`` in the targets' shardings.
    """
    restore_args = jax.tree_util.tree_map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape,
                                                                         dtype=a.dtype), targets)
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
      return ckptr.restore(self._state_dir(step), args=ocp.args.PyTreeRestore(
          item=targets, restore_args=restore_args, partial_restore=True))

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_with_shardings(tree, shardings):
  """``jax.ShapeDtypeStruct`` tree carrying ``shardings`` (the restore target for a mesh)."""
  return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)
