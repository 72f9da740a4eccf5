"""A run's workdir and process group: the exclusive workdir lock, ``jax.distributed`` start-up, the refusals a
run raises before it trains, and :func:`run_locked`, which every task's ``run`` (training, distillation) goes
through."""

import datetime
import fcntl
import json
import logging
import os
import pathlib
import shutil
import socket

import jax
import numpy as np

from jaxwm.training import writers


class RunRefusedError(RuntimeError):
  """A run refused to start (locked workdir, a checkpoint of another model, no intact checkpoint) before
  training; the message is one line."""


class WorkdirLockedError(RunRefusedError):
  """Another live process holds the workdir's lock; nothing in the workdir was changed."""


def maybe_initialize_distributed(config):
  """Joins a multi-process run when ``train.distributed`` or ``JAX_COORDINATOR_ADDRESS`` asks for one and
  ``jax.distributed`` is not initialised yet. Outside clusters jax detects (TPU pods, SLURM, ...),
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` name the run's size and this process; CPU processes
  use gloo collectives."""
  if not (config.train.get("distributed", False) or "JAX_COORDINATOR_ADDRESS" in os.environ):
    return
  if jax.distributed.is_initialized():
    return
  kw = {}
  if "JAX_NUM_PROCESSES" in os.environ:
    if "JAX_PROCESS_ID" not in os.environ:
      raise RunRefusedError("JAX_NUM_PROCESSES is set but JAX_PROCESS_ID is not: set both (this process's index "
                            "in [0, JAX_NUM_PROCESSES))")
    kw = {"num_processes": int(os.environ["JAX_NUM_PROCESSES"]), "process_id": int(os.environ["JAX_PROCESS_ID"])}
  if os.environ.get("JAX_PLATFORMS", "").split(",")[0] == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from jaxwm.training.runner import TrainConfig  # pylint: disable=g-import-not-at-top
  tc = TrainConfig.from_dict(config.train)
  jax.distributed.initialize(**kw, initialization_timeout=tc.init_timeout_s,
                             heartbeat_timeout_seconds=tc.heartbeat_timeout_s)
  logging.info("jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count())


class WorkdirLock:
  """An exclusive lock on a workdir: ``<workdir>/.lock``, held with ``fcntl.flock`` for the life of
  :func:`run` (the kernel releases it when the process dies, so a lock left by a dead process is
  free and is taken over with a message). The file holds ``{"pid", "host", "started"}`` of the
  holder, named when another run is refused. On file systems without ``flock`` the file alone is
  the lock: a pid that is alive on this host (or any pid of another host) holds it.
  """

  def __init__(self, workdir):
    self.path = pathlib.Path(workdir) / ".lock"
    self._fd = None

  @staticmethod
  def _holder(fd):
    try:
      info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
      return info if isinstance(info, dict) else None
    except (ValueError, UnicodeDecodeError, OSError):
      return None

  def _refusal(self, h):
    return WorkdirLockedError(
        f"workdir {self.path.parent} is in use by pid {h.get('pid')} on host {h.get('host')} (started "
        f"{h.get('started')}; lock {self.path}): wait for that run to end or stop it, or pass another --workdir")

  def acquire(self, say=None):
    """Takes the lock or raises :class:`WorkdirLockedError` naming the holder (pid, host, start time);
    the workdir must exist. Nothing is written unless the lock is taken."""
    say = say or writers.say
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      flocked = True
    except BlockingIOError:
      h = self._holder(fd) or {}
      os.close(fd)
      raise self._refusal(h) from None
    except OSError:  # no flock on this file system: the pid in the file decides
      flocked = False
    h = self._holder(fd)
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    if h and h.get("pid") != me["pid"]:
      if not flocked and (h.get("host") != me["host"] or _pid_alive(h.get("pid"))):
        os.close(fd)
        raise self._refusal(h)
      say(f"taking over the stale lock of pid {h.get('pid')} on host {h.get('host')} (started {h.get('started')}): "
          "that process is gone")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self):
    """Empties the lock file and releases it (the file stays: unlinking a flock file races)."""
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


def _pid_alive(pid):
  """Whether process ``pid`` exists on this host."""
  try:
    os.kill(int(pid), 0)
  except PermissionError:  # alive, another user's
    return True
  except (ProcessLookupError, TypeError, ValueError, OverflowError):
    return False
  return True


def lock_workdir(workdir):
  """:class:`WorkdirLock` taken by process 0; every process raises when it could not be taken."""
  lock, err = WorkdirLock(workdir), None
  if jax.process_index() == 0:
    try:
      lock.acquire()
    except WorkdirLockedError as e:
      err = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if not int(multihost_utils.broadcast_one_to_all(np.int32(err is None))) and err is None:
      err = WorkdirLockedError(f"workdir {workdir} is locked by another run (see process 0's message)")
  if err is not None:
    raise err
  return lock



def run_locked(body, config, workdir, mesh, progress):
  """``body(config, workdir, mesh, progress)`` in a locked workdir (jax.distributed first, when configured); a
  refused run (:class:`RunRefusedError`) removes a workdir it created. Every task's ``run`` goes through it."""
  maybe_initialize_distributed(config)
  workdir = pathlib.Path(workdir).absolute()
  fresh = not workdir.exists()
  workdir.mkdir(parents=True, exist_ok=True)
  lock = lock_workdir(workdir)
  try:
    return body(config, workdir, mesh, progress)
  except RunRefusedError:
    if fresh and jax.process_index() == 0:
      lock.release()
      shutil.rmtree(workdir, ignore_errors=True)  # only this run wrote there: nothing is left behind
    raise
  finally:
    lock.release()
