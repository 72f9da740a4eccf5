"""What ``train.py`` runs, chosen by ``train.task``: one registry line per task.

A task module has ``run(config, workdir, mesh=None, progress=True, hooks=())`` (it builds a
:class:`jaxwm.training.runner.Task` and runs it in :func:`jaxwm.training.runner.run_steps`); a task may name a
module whose ``training_hooks(config)`` gives the hooks ``train.py`` passes it (probes, samples).

- ``diffusion`` (the default): flow-matching training, :mod:`jaxwm.training.loop`, with the probes and samples
  of :mod:`jaxwm.evaluation.hooks`;
- ``distill``: few-step DMD distillation into a LoRA adapter, :mod:`jaxwm.distill.loop` (``configs/distill.py``).
"""

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class TaskEntry:
  """``run_module``: the module with ``run``; ``hooks_module``: the module with ``training_hooks`` (or none);
  ``block``: the top-level config block the task adds (or none)."""
  run_module: str
  hooks_module: str = ""
  block: str = ""


TASKS = {
    "diffusion": TaskEntry("jaxwm.training.loop", "jaxwm.evaluation.hooks"),
    "distill": TaskEntry("jaxwm.distill.loop", block="distill"),
}
DEFAULT = "diffusion"


def task_name(config):
  """``config.train.task`` (configs saved before the key existed: ``distill`` when they have a ``distill`` block)."""
  return config.train.get("task", "distill" if "distill" in config else DEFAULT)


def run(config, workdir, mesh=None, progress=True, hooks=None):
  """Runs the config's task; ``hooks=None`` takes the task's own (``training_hooks(config)``)."""
  entry = TASKS[task_name(config)]
  if hooks is None:
    hooks = importlib.import_module(entry.hooks_module).training_hooks(config) if entry.hooks_module else ()
  return importlib.import_module(entry.run_module).run(config, workdir, mesh=mesh, progress=progress, hooks=hooks)
