"""Orbax checkpoints: train state (restored into the current mesh's shardings), data-iterator
state and config, written atomically (a temporary directory renamed on completion), async
where available, keeping the newest ``keep``; every step carries checksums of its files.

A step's directory ``<directory>/<step>/`` holds the composite items ``state`` (the train state:
``step``, ``params``, ``opt_state``, ``ema``, ``routing``), ``data`` and ``config``, and
``checksums.json``: the size and sha256 of every file Orbax wrote, computed in the temporary
directory just before Orbax renames it into place, so every committed step has them. Loading for
inference reads single fields of ``state`` (:meth:`Checkpointer.restore_fields`), never the
optimizer state.

Restoring verifies a step first (:func:`verify_step`). A damaged or incomplete step (a changed,
truncated or missing file, a missing ``_METADATA``, an empty or garbage directory) is reported in
one line naming the step and the reason, and restoring falls back to the newest intact step. A
training run (``Checkpointer(..., set_aside=True)``) moves damaged steps newer than the one it
restored to ``<directory>/damaged/<step>`` (never deletes them: Orbax would otherwise refuse to
save those steps again); readers leave them in place. Steps written before checksums were kept
are accepted with a one-line note, and damage that Orbax itself reports while restoring one of
them is treated like a checksum mismatch. Orbax's temporary directories of a save that was killed
(``<step>.orbax-checkpoint-tmp``) are never steps: Orbax replaces one when it saves that step again.
"""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import sys

import grain.python as grain
import jax
import orbax.checkpoint as ocp

CHECKSUMS = "checksums.json"
DAMAGED = "damaged"  # where a training run moves damaged steps (not a number: Orbax ignores it)
TMP_SUFFIX = ".orbax-checkpoint-tmp"
# Written by Orbax after the checksums (commit timestamp, commit marker): checked for shape, not checksummed.
_AFTER_CHECKSUMS = ("_CHECKPOINT_METADATA", "commit_success.txt")


class DamagedCheckpointError(FileNotFoundError):
  """No intact checkpoint where one was expected: the step asked for (or every step) is damaged."""


def _say(msg):
  """One line to stderr (process 0 only)."""
  if jax.process_index() == 0:
    print(msg, file=sys.stderr, flush=True)


def _sha256(path):
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


def _files(step_dir):
  """Relative POSIX paths of the checksummed files of a step directory (sorted)."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = pathlib.Path(root, name).relative_to(step_dir).as_posix()
      if rel != CHECKSUMS and rel not in _AFTER_CHECKSUMS and not name.startswith(f".{CHECKSUMS}.tmp"):
        out.append(rel)
  return sorted(out)


def _digests(step_dir, names):
  """``{name: sha256}``, hashed in parallel threads (hashlib releases the GIL)."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
    return dict(zip(names, pool.map(lambda n: _sha256(pathlib.Path(step_dir, n)), names)))


def write_checksums(step_dir):
  """Writes ``<step_dir>/checksums.json``: ``{"files": {relpath: {"size", "sha256"}}}`` of every file
  under ``step_dir`` (but the Orbax commit files), atomically (a temporary file renamed)."""
  step_dir = pathlib.Path(step_dir)
  names = _files(step_dir)
  sums = _digests(step_dir, names)
  files = {n: {"size": (step_dir / n).stat().st_size, "sha256": sums[n]} for n in names}
  tmp = step_dir / f".{CHECKSUMS}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"version": 1, "algorithm": "sha256", "files": files}, f, indent=0, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, step_dir / CHECKSUMS)


def _json_problem(path, name):
  """A reason string when ``path`` is missing, empty or not JSON; None when it parses."""
  if not path.is_file():
    return f"{name} missing"
  if path.stat().st_size == 0:
    return f"{name} is empty"
  try:
    json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    return f"{name} is not valid JSON ({e})"
  return None


def verify_step(step_dir):
  """Checks one step directory against its ``checksums.json``.

  Returns:
    ``(status, reason)``: ``("ok", None)`` when every checksummed file is present with its size and
    sha256; ``("unverified", note)`` for a step without checksums (written before they were kept)
    that looks complete; ``("damaged", reason)`` with a one-line reason otherwise (the first
    problem found and how many more files differ).
  """
  step_dir = pathlib.Path(step_dir)
  if not step_dir.is_dir():
    return "damaged", "not a directory"
  if not any(step_dir.iterdir()):
    return "damaged", "empty directory"
  if (step_dir / "_CHECKPOINT_METADATA").exists():
    problem = _json_problem(step_dir / "_CHECKPOINT_METADATA", "_CHECKPOINT_METADATA")
    if problem:
      return "damaged", problem
  sums_path = step_dir / CHECKSUMS
  if not sums_path.exists():
    problem = _json_problem(step_dir / "state" / "_METADATA", "state/_METADATA")
    if problem:
      return "damaged", problem
    empty = [n for n in _files(step_dir) if (step_dir / n).stat().st_size == 0]
    if empty:
      return "damaged", f"{empty[0]} is empty" + (f" (and {len(empty) - 1} more empty files)" if len(empty) > 1 else "")
    return "unverified", f"no {CHECKSUMS} (written before checksums were kept): not verified"
  try:
    files = json.loads(sums_path.read_text(encoding="utf-8"))["files"]
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    return "damaged", f"{CHECKSUMS} is unreadable ({type(e).__name__}: {e})"
  problems, to_hash = [], []
  for name, want in sorted(files.items()):
    path = step_dir / name
    if not path.is_file():
      problems.append(f"{name} missing")
    elif path.stat().st_size != want["size"]:
      problems.append(f"{name} is {path.stat().st_size} bytes, {want['size']} when saved (truncated or overwritten)")
    else:
      to_hash.append(name)
  if not problems:  # sizes agree: hash
    sums = _digests(step_dir, to_hash)
    problems = [f"{n} does not match its checksum (bit flip or overwrite)" for n in to_hash
                if sums[n] != files[n]["sha256"]]
  if problems:
    more = f" (and {len(problems) - 1} more files differ)" if len(problems) > 1 else ""
    return "damaged", problems[0] + more
  return "ok", None


def step_dirs(directory):
  """``{step: path}`` of the step directories (names of digits only; Orbax's temporary directories
  ``<step>.orbax-checkpoint-tmp`` and ``damaged/`` are not steps)."""
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    return {}
  return {int(p.name): p for p in directory.iterdir() if p.name.isdigit() and p.is_dir()}


def _first_line(e):
  lines = [x.strip() for x in str(e).splitlines() if x.strip()]
  return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _empty_fields(state):
  """Names of a dataclass state's fields that hold no arrays ({} or None): those an older checkpoint may lack."""
  if not dataclasses.is_dataclass(state):
    return []
  return [f.name for f in dataclasses.fields(state) if not jax.tree_util.tree_leaves(getattr(state, f.name))]


class Checkpointer:
  """Saves and restores ``{state, data, config}`` under ``directory/<step>``.

  Args:
    directory: the checkpoints directory.
    keep: newest steps kept (>= 1; None keeps all).
    async_save: return from :meth:`save` before the files are written (call :meth:`wait` or
      :meth:`close` before reading them).
    set_aside: when restoring the newest intact step (``step=None``), move damaged newer steps
      to ``directory/damaged/`` and re-apply ``keep`` (a training run that then saves; readers
      such as ``sample.py`` leave the directory untouched).
    say: where notes and damage reports go (default: one line to stderr, process 0).
  """

  def __init__(self, directory, keep=3, async_save=True, set_aside=False, say=_say):
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
      raise ValueError(f"keep={keep!r}: must be an int >= 1 (the newest checkpoints kept), or None for all")
    self.directory = pathlib.Path(directory).absolute()  # orbax needs absolute paths
    self.keep, self.async_save, self.set_aside, self.say = keep, async_save, set_aside, say
    self._pending = collections.deque()  # steps saved whose checksums are not written yet
    # Always Orbax's async checkpointer (its finalisation hook writes the checksums before the commit);
    # a synchronous save waits for it.
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, create=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._write_pending_checksums)),
        item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.PyGrainCheckpointHandler(),
                       "config": ocp.JsonCheckpointHandler()},
    )

  def _write_pending_checksums(self):
    """Orbax's post-finalisation hook (primary process, all processes' files written, before the
    temporary directory is renamed to ``<step>``): writes the step's ``checksums.json``."""
    if not self._pending:
      return
    step = self._pending.popleft()
    tmp = self.directory / f"{step}{TMP_SUFFIX}"
    step_dir = tmp if tmp.is_dir() else self.directory / str(step)  # no rename on some file systems
    try:
      write_checksums(step_dir)
    except Exception as e:  # pylint: disable=broad-except  # never fail the save: it stays readable, unverified
      logging.warning("could not write checksums of checkpoint step %d: %s", step, e)
      self.say(f"warning: could not write {CHECKSUMS} of checkpoint step {step} ({_first_line(e)}); "
               "it will be restored unverified")

  def latest_step(self):
    """The newest step directory (intact or not), or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def all_steps(self):
    """Sorted steps with a directory (see :func:`step_dirs`)."""
    return sorted(step_dirs(self.directory))

  def save(self, step, state, data_iterator=None, config=None):
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items["data"] = grain.PyGrainCheckpointSave(data_iterator)
    if config is not None:
      items["config"] = ocp.args.JsonSave(json.loads(config.to_json()) if hasattr(config, "to_json") else config)
    self.manager.wait_until_finished()  # one save in flight: the hook pairs with the step queued here
    self._pending.clear()
    if jax.process_index() == 0:
      self._pending.append(int(step))
    saved = self.manager.save(int(step), args=ocp.args.Composite(**items))
    if not saved:
      self._pending.clear()
      raise ValueError(f"checkpoint step {step} was not saved: Orbax refuses steps <= its latest, "
                       f"{self.manager.latest_step()} (in {self.directory})")
    if not self.async_save:
      self.manager.wait_until_finished()
    logging.info("checkpoint of step %d requested in %s", step, self.directory)

  def verify(self, step):
    """``(status, reason)`` of one step (:func:`verify_step`)."""
    return verify_step(self.directory / str(int(step)))

  def restore(self, abstract_state, data_iterator=None, step=None, check=None):
    """Restores into ``abstract_state`` (a pytree of ``jax.ShapeDtypeStruct`` with shardings).

    Args:
      abstract_state: the restore target.
      data_iterator: a grain iterator advanced to its saved position (if given).
      step: the step to restore; it must be intact. None: the newest intact step; damaged newer
        ones are reported (one line each) and, with ``set_aside``, moved to ``damaged/`` (and
        ``keep`` re-applied) once the restore succeeded.
      check: ``check(step)`` is called before restoring a step (it may raise to refuse it).

    Returns:
      ``(state, step)``. Raises :class:`DamagedCheckpointError` when ``step`` (or every step) is
      damaged, ``FileNotFoundError`` when there is no such step.
    """
    damaged = {}
    state, step = self.restore_with(lambda s: self._restore(abstract_state, data_iterator, s), step, check, damaged)
    if self.set_aside and damaged:
      self._set_aside({s: r for s, r in damaged.items() if s > step})
    if self.set_aside:
      self.apply_retention()
    return state, step

  def restore_with(self, attempt, step=None, check=None, damaged=None, user_errors=()):
    """Calls ``attempt(step)`` on ``step``, or on the newest step that verifies, falling back to older ones.

    A step is skipped (and reported in one line) when :func:`verify_step` finds it damaged, or when
    it has no checksums and ``attempt`` fails with an Orbax or I/O error (damage that checksums would
    have caught). ``check(step)`` runs before ``attempt``; its errors, ``user_errors`` and
    ``attempt``'s errors on a checksummed step propagate.

    Args:
      attempt: ``attempt(step) -> result``.
      step: a given step (it must be intact; no fallback), or None for the newest intact one.
      check: ``check(step)``, or None.
      damaged: a dict that receives ``{step: reason}`` of the damaged steps found.
      user_errors: exception types of ``attempt`` that are not damage (e.g. a parameter tree of
        another model).

    Returns:
      ``(result, step)``. Raises ``FileNotFoundError`` when there is no (such) step and
      :class:`DamagedCheckpointError` when ``step``, or every step, is damaged.
    """
    damaged = {} if damaged is None else damaged
    steps = self.all_steps()
    if step is not None and int(step) not in steps:
      raise FileNotFoundError(f"step={step}: no such checkpoint in {self.directory}; steps: {steps}")
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if step is None:
      for tmp in sorted(p.name for p in self.directory.glob(f"*{TMP_SUFFIX}*")):
        self.say(f"note: {self.directory / tmp} is an unfinished save (killed while saving?): not a step, ignored; "
                 "Orbax replaces it when it saves that step again")
    for s in [int(step)] if step is not None else reversed(steps):
      status, reason = self.verify(s)
      if status == "ok":
        if check is not None:
          check(s)
        return attempt(s), s
      if status == "unverified":
        self.say(f"note: checkpoint step {s}: {reason}")
        if check is not None:
          check(s)
        try:
          return attempt(s), s
        except user_errors:
          raise
        except Exception as e:  # pylint: disable=broad-except  # Orbax/TensorStore/JSON read errors (any type)
          if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e):  # the host, not the step
            raise
          reason = f"restore failed: {_first_line(e)}"
      damaged[s] = reason
      if step is not None:
        raise DamagedCheckpointError(f"checkpoint step {s} in {self.directory} is damaged: {reason} "
                                     f"(steps: {steps})")
      self.say(f"checkpoint step {s} in {self.directory} is damaged: {reason}; trying the next older step")
    listed = "; ".join(f"step {s}: {r}" for s, r in sorted(damaged.items(), reverse=True))
    raise DamagedCheckpointError(f"no intact checkpoint in {self.directory} ({listed}); move the damaged steps "
                                 "away to start afresh")

  def _restore(self, abstract_state, data_iterator, step):
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.PyGrainCheckpointRestore(data_iterator)
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except ValueError as e:
      # Checkpoints written before an optional state field existed (TrainState.routing, DistillState.disc and
      # disc_opt): when the mismatch names a field that is empty in this state ({} or None), restore the
      # others; the empty fields keep their value.
      empty = _empty_fields(abstract_state)
      if not any(re.search(rf"\b{name}\b", str(e)) for name in empty):
        raise
      legacy = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)
                if f.name not in empty}
      items["state"] = ocp.args.StandardRestore(legacy)
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
      logging.info("restored a checkpoint written before the state's fields %s existed", sorted(empty))
      return abstract_state.replace(**restored["state"])
    return restored["state"]

  def _set_aside(self, damaged):
    """Moves damaged steps ``{step: reason}`` to ``directory/damaged/<step>`` (process 0), never deleting."""
    self._barrier("before_set_aside")  # every process has verified before one moves
    if damaged and jax.process_index() == 0:
      for s in sorted(damaged):
        dest = self.directory / DAMAGED / str(s)
        n = 1
        while dest.exists():
          dest, n = self.directory / DAMAGED / f"{s}.{n}", n + 1
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.directory / str(s), dest)
        self.say(f"moved damaged checkpoint step {s} to {dest} (not deleted: inspect or remove it yourself)")
    self._sync_and_reload("set_aside")

  def apply_retention(self):
    """Deletes the oldest steps beyond ``keep`` (left over when a run was killed between a commit
    and Orbax's clean-up); damaged steps set aside are not counted."""
    self._barrier("before_retention")
    steps = self.all_steps()
    extra = steps[:-self.keep] if self.keep is not None and len(steps) > self.keep else []
    if extra and jax.process_index() == 0:
      for s in extra:
        shutil.rmtree(self.directory / str(s))
      self.say(f"removed checkpoint step(s) {extra} beyond keep={self.keep} (left by an interrupted run)")
    self._sync_and_reload("retention")

  @staticmethod
  def _barrier(tag):
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(f"jaxwm_checkpoint_{tag}")

  def _sync_and_reload(self, tag):
    """After process 0 moved or deleted steps: a barrier, then Orbax re-reads the step list."""
    self._barrier(tag)
    self.manager.reload()

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
