"""Training probes and samples as :class:`jaxwm.training.runner.Hook` objects, passed to a run by ``train.py``
(:func:`training_hooks`), so that :mod:`jaxwm.training` never imports evaluation code.

- :class:`ProbeHook`: every ``train.gain_every`` steps (and at the last; on log lines), the memory gain
  ``gain_<t>`` (:mod:`jaxwm.evaluation.memory_gain`) and the co-visible proxy ``covis_tf_<t>``
  (:mod:`jaxwm.evaluation.covisible_probe`) on fixed eval loops;
- :class:`SampleHook`: every ``train.sample_every`` steps (and at the last) a GIF of eval clip 0,
  ``<workdir>/samples/step_<step>.gif`` (ground truth | generated), and on resume the sample of the restored step
  when the previous run stopped before writing it.
"""

import jax
import numpy as np

from jaxwm.training.runner import Hook, due
from jaxwm.training.writers import say


class ProbeHook(Hook):
  """Teacher-forced probes (no sampling) every ``every`` steps: ``gain_<t>`` and ``covis_tf_<t>``."""

  def __init__(self, every):
    self.every, self.probes = int(every), []

  def on_start(self, task, state, start):
    from jaxwm.evaluation import covisible_probe, memory_gain  # pylint: disable=g-import-not-at-top
    model = task.trainer.model
    self.probes = [memory_gain.GainProbe(task.config, model), covisible_probe.CovisProbe(task.config, model)]

  def scalars(self, task, state, done):
    out = {}
    if due(done, self.every, task.num_steps):
      with jax.set_mesh(task.trainer.mesh):
        for probe in self.probes:
          out.update(probe(state.params))
    return out

  def postfix(self, scalars):
    out = {}
    if "gain_1" in scalars:
      out["gain_1"] = f"{scalars['gain_1']:.2f}"
    if "covis_tf_0.5" in scalars:  # at t = 0.5 (t = 1 is pure noise: it says little about seeing)
      out["covis"] = f"{scalars['covis_tf_0.5']:.1f}"
    return out


def write_sample(trainer, params, step, path):
  """Streams eval clip 0 (a rotation loop) from its first frame; writes ground truth | generated as a GIF."""
  from jaxwm.sampling.clips import eval_clip, stream_clip  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=g-import-not-at-top
  clip = eval_clip(trainer.config, 0)
  frames = stream_clip(trainer.model, {"params": params}, trainer.config, clip, key=jax.random.key(step))
  if jax.process_index():  # every process streams (sharded parameters need them all); process 0 writes
    return
  write_video(path, labelled({"ground truth": clip["frames"], f"generated (step {step})": frames},
                             pose_captions(clip["c2w"]), scale=4), fps=4)


def _exists_on_process_0(path):
  """Whether ``path`` exists, as process 0 sees it (every process must agree to stream together)."""
  here = path.exists() if jax.process_index() == 0 else False
  if jax.process_count() == 1:
    return here
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(multihost_utils.broadcast_one_to_all(np.int32(here)))


class SampleHook(Hook):
  """A sample GIF every ``every`` steps and at the last: every process streams it, process 0 writes it."""

  def __init__(self, every):
    self.every = int(every)

  def _path(self, task, step):
    return task.workdir / "samples" / f"step_{step:06d}.gif"

  def on_start(self, task, state, start):
    if start and due(start, self.every, task.num_steps):
      path = self._path(task, start)
      if not _exists_on_process_0(path):
        say(f"writing {path}: the sample of step {start}, missed by the previous run")
        write_sample(task.trainer, state.params, start, path)

  def after_save(self, task, state, done):
    if due(done, self.every, task.num_steps):
      write_sample(task.trainer, state.params, done, self._path(task, done))


def training_hooks(config):
  """The hooks ``config.train`` asks for: :class:`ProbeHook` when ``gain_every``, :class:`SampleHook` when
  ``sample_every``."""
  tc = config.train
  hooks = []
  if tc.get("gain_every", 0):
    hooks.append(ProbeHook(tc.gain_every))
  if tc.get("sample_every", 0):
    hooks.append(SampleHook(tc.sample_every))
  return hooks
