"""The one step loop behind ``train.py``, shared by every task (training, distillation).

A :class:`Task` says what a step is; :func:`run_steps` does the rest, the same for every task: restore-or-init
(through the task), the next batch loaded while a step computes, progress bar, log cadence with rates, a stop on
a non-finite metric before that state can reach a checkpoint, checkpoint cadence, hooks, and closing what it
opened. :class:`Hook` is how a caller adds
probes and samples (the CLI passes them: ``jaxwm.training`` never imports ``jaxwm.evaluation``).

Cadences (``config.train``): a log line every ``log_every`` steps and at the last step (hooks add their scalars
to log lines only), a checkpoint every ``ckpt_every`` steps and at the last, then :meth:`Hook.after_save`.

SIGTERM or SIGINT (a preemption, Ctrl-C) stops the run at the next step boundary that every process agrees on:
that step is checkpointed like a periodic one (state, data iterator) and :class:`StopRequested` is raised
(``train.py`` exits with :data:`STOPPED_EXIT_CODE`); the same command resumes from it.
"""

import dataclasses
import math
import signal
import threading
import time

import jax
import numpy as np
from tqdm import tqdm

from jaxwm import tasks
from jaxwm.settings import Block, Bool, Choice, Int, Str, setting
from jaxwm.training.writers import MetricWriters


@dataclasses.dataclass(frozen=True)
class TrainConfig(Block):
  """The ``train`` block: the loop's lengths and cadences (a resume may change any; ``num_steps`` is logged).

  Attributes:
    num_steps: steps of the run (the cosine schedule spans them).
    log_every: a log line (metrics.jsonl, TensorBoard, progress bar) every k steps and at the last.
    ckpt_every: a checkpoint every k steps and at the last.
    keep: checkpoints kept.
    async_checkpoint: write checkpoints in the background.
    sample_every: a sample GIF of eval clip 0 every k steps and at the last (0: none).
    workdir: where the run writes (``--workdir`` overrides it).
    distributed: join a multi-process run (``jax.distributed``).
    init_from: an earlier stage's workdir, or the released Wan transformer's ``.safetensors`` (fine-tuning).
    gain_every: the memory gain and the co-visible proxy every k steps and at the last, on log lines (0: off).
    task: what ``train.py`` runs (:data:`jaxwm.tasks.TASKS`: ``diffusion`` | ``distill``).
    init_timeout_s: a multi-process run: seconds every process waits for all to join (``jax.distributed``).
    heartbeat_timeout_s: a multi-process run: seconds without a heartbeat after which JAX's coordination service
      declares a process dead and ends the others (a hung collective ends no sooner than this).
  """
  PREFIX = "train"
  num_steps: int = setting(900, Int(lo=1))
  log_every: int = setting(10, Int(lo=1), resume="free")
  ckpt_every: int = setting(300, Int(lo=1), resume="free")
  keep: int = setting(3, Int(lo=1, allowed="must be an integer >= 1 (checkpoints kept; 0 would keep none)"),
                      resume="free")
  async_checkpoint: bool = setting(True, Bool(), resume="free")
  sample_every: int = setting(900, Int(lo=0, allowed="must be an integer >= 0 (0: no periodic samples)"),
                              resume="free")
  workdir: str = setting("runs/tiny", Str(nonempty=True), resume="free")
  distributed: bool = setting(False, Bool(), resume="free")
  init_from: str = setting("", Str(), resume="free")
  gain_every: int = setting(300, Int(lo=0, allowed="must be an integer >= 0 (0: no memory-gain probe)"),
                            resume="free", absent=0)
  task: str = setting(tasks.DEFAULT, Choice(lambda: tuple(tasks.TASKS)), resume="free")
  init_timeout_s: int = setting(300, Int(lo=1), resume="free")
  heartbeat_timeout_s: int = setting(100, Int(lo=1), resume="free")


class NonFiniteLossError(FloatingPointError):
  """Raised when a step's loss (or another checked metric) is NaN or inf; that state is never checkpointed."""


STOP_SIGNALS = ("SIGTERM", "SIGINT")
STOPPED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped on request with its state saved; the same command resumes it


class StopRequested(Exception):
  """The run stopped at a step boundary on SIGTERM/SIGINT (a preemption, Ctrl-C) after committing a checkpoint of
  that step (train state, EMA, data iterator): the same command resumes it as from any checkpoint."""

  def __init__(self, signame, step, directory):
    self.signame, self.step, self.directory = signame, step, directory
    super().__init__(f"stopped by {signame} at step {step}: its checkpoint is committed in {directory}; the same "
                     "command resumes from it")


class _StopSignals:
  """While active (main thread only), SIGTERM and SIGINT are recorded instead of killing the process; a second
  signal changes nothing (a save in progress finishes). ``requested``: the first signal's name, or None."""

  def __init__(self):
    self.requested, self._previous = None, {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for name in STOP_SIGNALS:
        sig = getattr(signal, name)
        self._previous[sig] = signal.signal(sig, self._record)
    return self

  def _record(self, signum, frame):
    del frame
    self.requested = self.requested or signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False


def _agreed(requested):
  """Whether any process asked to stop (every process calls it at the same step, so all stop at that step)."""
  if jax.process_count() == 1:
    return bool(requested)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.max(multihost_utils.process_allgather(np.int32(bool(requested)))))


class Task:
  """What one kind of run does. Subclasses set ``name`` (the progress bar's label), ``num_steps``,
  ``config`` and ``workdir`` and implement the methods below; the loop calls them in this order."""

  name = "task"
  num_steps = 0
  config = None
  workdir = None

  def checkpointer(self):
    """The run's :class:`jaxwm.checkpoint.Checkpointer`."""
    raise NotImplementedError

  def make_loader(self):
    """The data loader (its iterator is checkpointed with the state)."""
    raise NotImplementedError

  def restore_or_init(self, ckpt, data_iter):
    """``(state, start)``: resumed (:func:`jaxwm.training.resume.restore_or_init`) or fresh."""
    raise NotImplementedError

  def step(self, state, host_batch, step):
    """Step ``step`` (from 0) on a loader batch: ``(state, metrics)``, ``metrics`` a dict of scalars (device arrays:
    the loop loads the next batch before it reads them), every one checked finite."""
    raise NotImplementedError

  def loss(self, metrics):
    """The value of ``metrics`` that goes into the returned history."""
    raise NotImplementedError

  def nonfinite_message(self, step, metrics, latest):
    """The one-line message of the stop at ``step`` (from 1); ``latest`` is the newest checkpoint step."""
    bad = ", ".join(f"{k} {v}" for k, v in metrics.items() if not math.isfinite(v))
    return (f"non-finite {self.name} state at step {step} ({bad}): stopped, and this state was not checkpointed "
            f"(latest checkpoint: step {latest})")

  def summarise(self, window, rate):
    """The scalars of a log line from the metrics of the steps since the previous one (``window``) and the
    steps per second."""
    raise NotImplementedError

  def postfix(self, scalars):
    """The progress bar's fields after a log line."""
    return {}

  def on_save(self, ckpt, done, state, data_iter):
    """Saves step ``done`` (the state, the data iterator and whatever else the task keeps)."""
    raise NotImplementedError


class Hook:
  """Something run alongside the loop (a probe, periodic samples); every method may be left as is."""

  def on_start(self, task, state, start):
    """After restore-or-init, before the first step (``start``: the restored step, 0 when fresh)."""

  def scalars(self, task, state, done):
    """Extra scalars for the log line of step ``done`` (``{}`` off its cadence)."""
    return {}

  def postfix(self, scalars):
    """Progress bar fields from a log line's scalars."""
    return {}

  def after_save(self, task, state, done):
    """After step ``done`` (and its checkpoint when one was due)."""


def due(done, every, last):
  """Whether a cadence of ``every`` steps (0: never) fires at step ``done``; it always fires at ``last``."""
  return bool(every) and (done % every == 0 or done == last)


def run_steps(task, progress=True, hooks=(), prefetch=True):
  """Runs ``task`` from its restored (or fresh) state to ``task.num_steps``; returns ``(state, history)``, the
  history being :meth:`Task.loss` of every step of this call. Raises :class:`NonFiniteLossError` on a
  non-finite metric, before that state is checkpointed, and :class:`StopRequested` after checkpointing the step
  at which a SIGTERM/SIGINT stopped it. ``prefetch=False`` loads each batch only after the previous step has
  finished (the baseline of ``benchmarks/train_loop.py``)."""
  with _StopSignals() as stops:
    return _loop(task, progress, hooks, prefetch, stops)


def _loop(task, progress, hooks, prefetch, stops):
  tc = task.config.train
  n = task.num_steps
  data_iter = iter(task.make_loader())
  ckpt = task.checkpointer()
  writers = bar = None
  try:
    state, start = task.restore_or_init(ckpt, data_iter)
    for h in hooks:
      h.on_start(task, state, start)
    writers = MetricWriters(task.workdir, start)
    history, window = [], []
    bar = tqdm(total=n, initial=start, disable=not progress or jax.process_index() != 0, desc=task.name,
               dynamic_ncols=True)
    t_last = time.perf_counter()
    host = next(data_iter) if start < n else None
    for step in range(start, n):
      done = step + 1
      state, pending = task.step(state, host, step)  # dispatched: computes while the host goes on
      stopping = done < n and _agreed(stops.requested)  # a signal since the last step: save this one and stop
      saving = due(done, tc.ckpt_every, n) or stopping
      # The next batch loads while this step computes, but not before a checkpoint (the data iterator's position
      # is saved with the state).
      host = next(data_iter) if prefetch and done < n and not saving else None
      metrics = {k: float(v) for k, v in pending.items()}  # waits for the step
      if not prefetch and done < n and not saving:
        host = next(data_iter)
      if not all(map(math.isfinite, metrics.values())):
        raise NonFiniteLossError(task.nonfinite_message(step + 1, metrics, ckpt.latest_step()))
      history.append(task.loss(metrics))
      window.append(metrics)
      bar.update(1)
      if due(done, tc.log_every, n):
        rate = len(window) / max(time.perf_counter() - t_last, 1e-9)
        scalars = task.summarise(window, rate)
        for h in hooks:
          scalars.update(h.scalars(task, state, done))
        writers.write(done, scalars)
        fields = task.postfix(scalars)
        for h in hooks:
          fields.update(h.postfix(scalars))
        bar.set_postfix(**fields)
        t_last, window = time.perf_counter(), []
      if saving:
        task.on_save(ckpt, done, state, data_iter)
      for h in hooks:
        h.after_save(task, state, done)
      if stopping:
        ckpt.wait()
        raise StopRequested(stops.requested or "a signal to another process", done, ckpt.directory)
      if saving and done < n:
        host = next(data_iter)
  finally:
    if bar is not None:
      bar.close()
    if writers is not None:
      writers.close()
    ckpt.close()
  return state, history
