"""The training loop behind ``train.py``: mesh, sharded init or exact resume, jitted teacher-forcing
steps, progress bar, TensorBoard/JSONL scalars, periodic sample GIFs, atomic checkpoints,
and a stop on a non-finite loss before it can reach a checkpoint.

A run holds an exclusive lock on its workdir (:class:`WorkdirLock`). Resuming restores the newest
intact checkpoint (damaged ones are reported and set aside, :mod:`jaxwm.checkpoint`), refuses a
config whose model differs from the checkpoint's (:func:`resume_config_differences`), rewinds
``metrics.jsonl`` and TensorBoard to the restored step, re-applies ``train.keep`` and redoes a
periodic sample that the previous run did not get to write.
"""

import dataclasses
import datetime
import fcntl
import json
import logging
import math
import os
import pathlib
import socket
import shutil
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxwm import checkpoint as ckpt_lib
from jaxwm.evaluation import covisible_probe, memory_gain
from jaxwm.models.config import ModelConfig
from jaxwm.models.transformer import WanModel
from jaxwm.training import data as data_lib
from jaxwm.training import sharding as sh
from jaxwm.training.augment import routing_pool
from jaxwm.training.layout import make_layout
from jaxwm.training.optim import learning_rate_schedule, make_optimizer
from jaxwm.training.step import latent_shape, make_init_fn, make_loss_fn, make_train_step


class NonFiniteLossError(FloatingPointError):
  """Raised when a step's loss is NaN or inf; the state of that step is never checkpointed."""


class RunRefusedError(RuntimeError):
  """:func:`run` refused to start (locked workdir, a checkpoint of another model, no intact
  checkpoint) before training; the message is one line."""


class WorkdirLockedError(RunRefusedError):
  """Another live process holds the workdir's lock; nothing in the workdir was changed."""


class ResumeConfigError(RunRefusedError, ValueError):
  """The config's model (or a parameter-shaping data setting) differs from the checkpoint's."""


class Trainer:
  """Everything a run needs, built from a config: model, mesh, shardings, jitted functions."""

  def __init__(self, config, workdir, mesh=None):
    self.config = config
    self.workdir = pathlib.Path(workdir)
    self.model_cfg = ModelConfig.from_dict(config.model)
    self.model = WanModel(self.model_cfg)
    self.mesh = mesh if mesh is not None else sh.make_mesh(config.mesh.data, config.mesh.fsdp)
    if not config.data.batch_size:  # 0: data.per_device_batch_size x the devices the batch is split over
      from jaxwm import config_checks  # pylint: disable=g-import-not-at-top
      config_checks.resolve_batch_size(config, self.mesh.size, jax.process_count())
    self.rules = sh.rules_from_config(config.sharding_rules)
    self.layout = make_layout(config.recipe.get("layout", "teacher_forcing"), config.data.num_frames,
                              config.recipe.chunk_size)
    num_steps = config.train.num_steps
    self.tx = make_optimizer(config.optim, num_steps)
    self.schedule = learning_rate_schedule(config.optim, num_steps)
    shape = latent_shape(config, len(self.layout.frame_pos))
    if self.model_cfg.camera_conditioned and self.model_cfg.camera.vae_stride != config.data.latent_stride:
      raise ValueError(f"model.camera.vae_stride={self.model_cfg.camera.vae_stride} must equal "
                       f"data.latent_stride={config.data.latent_stride}")
    hw = config.recipe.get("head_windows", {})
    routing = None
    if hw.get("enabled", False):
      routing = routing_pool(config.seed, self.model_cfg.num_heads, hw.get("pool", 12), hw.get("global_fraction", 0.25))
    init_fn = make_init_fn(self.model, self.tx, shape, config.optim.ema_decay, config.data.image_size, routing)
    with nn.logical_axis_rules(self.rules):
      abstract_boxed = jax.eval_shape(init_fn, jax.random.key(0))
      param_sh = sh.param_shardings(abstract_boxed.params, self.mesh, self.rules)
    self.abstract_state = nn.unbox(abstract_boxed)
    self.state_shardings = _state_shardings(self.abstract_state, param_sh, self.mesh)
    self._init = jax.jit(lambda key: nn.unbox(init_fn(key)), out_shardings=self.state_shardings)
    records = config.data.source == "records"
    null_text = None
    if records and self.model_cfg.cross_attn:
      null_text = data_lib.make_source(config.data).null_text()
    loss_fn = make_loss_fn(self.model, self.layout, config.recipe, config.data.latent_stride, null_text)
    step_fn = make_train_step(loss_fn, self.tx, self.schedule, config.optim.ema_decay)
    self.batch_shardings = {
        "latents" if records else "frames": sh.batch_sharding(self.mesh, self.rules, 5),
        "c2w": sh.batch_sharding(self.mesh, self.rules, 4),
        "intrinsics": sh.batch_sharding(self.mesh, self.rules, 4),
    }
    if self.model_cfg.cross_attn:
      self.batch_shardings["text_emb"] = sh.batch_sharding(self.mesh, self.rules, 3)

    def sharded_step(state, batch, key):
      with nn.logical_axis_rules(self.rules):
        return step_fn(state, batch, key)

    self.train_step = jax.jit(sharded_step, in_shardings=(self.state_shardings, self.batch_shardings, None),
                              out_shardings=(self.state_shardings, None), donate_argnums=(0,))
    self.tokens_per_step = (config.data.batch_size * len(self.layout.frame_pos) *
                            (shape[2] // self.model_cfg.patch_size[1]) * (shape[3] // self.model_cfg.patch_size[2]))

  def init_state(self, seed=None):
    with jax.set_mesh(self.mesh):
      return self._init(jax.random.key(self.config.seed if seed is None else seed))

  def put_batch(self, batch):
    """Host batch (this process's rows) -> global arrays sharded over the mesh."""
    return {k: jax.make_array_from_process_local_data(self.batch_shardings[k], np.asarray(batch[k]))
            for k in self.batch_shardings}

  def make_loader(self, seed=None):
    per_process = self.config.data.batch_size // jax.process_count()
    return data_lib.make_loader(self.config.data, self.config.seed if seed is None else seed, per_process)

  def checkpointer(self):
    """The run's :class:`jaxwm.checkpoint.Checkpointer` (it sets damaged steps aside when resuming)."""
    return ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=self.config.train.keep,
                                 async_save=self.config.train.async_checkpoint, set_aside=True)

  def restore_target(self):
    return ckpt_lib.abstract_with_shardings(self.abstract_state, self.state_shardings)


def _state_shardings(abstract_state, param_sh, mesh):
  """Optimiser moments and EMA (subtrees shaped like the params) follow the params; the rest is replicated."""
  rep = sh.replicated(mesh)
  params_struct = jax.tree_util.tree_structure(abstract_state.params)
  is_params = lambda x: jax.tree_util.tree_structure(x) == params_struct  # pylint: disable=unnecessary-lambda-assignment
  opt = jax.tree_util.tree_map(lambda x: param_sh if is_params(x) else rep, abstract_state.opt_state,
                               is_leaf=is_params)
  return abstract_state.replace(step=rep, params=param_sh, opt_state=opt, ema=param_sh if abstract_state.ema else {},
                                routing={} if isinstance(abstract_state.routing, dict) else rep)


def _say(msg):
  if jax.process_index() == 0:
    tqdm.write(msg)


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
  jax.distributed.initialize(**kw)
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
    say = say or _say
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


def _lock_workdir(workdir):
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


# Model keys that change how the model is computed, not what it computes: a resume may change them (logged).
_RUNTIME_MODEL_KEYS = ("model.dtype", "model.remat", "model.scan_unroll", "model.attention_impl",
                       "model.attention.impl", "model.attention.interpret", "model.loci.impl", "model.loci.chunk_size")
# Outside ``model``: settings that shape the parameters or the train state.
_SHAPE_KEYS = ("data.image_size", "data.latent_stride", "recipe.head_windows.enabled")
# Changes that are logged (one line each) on resume.
_LOGGED = ("optim.", "train.num_steps", "data.", "recipe.", "seed")
_ABSENT = "<absent>"


def _flat(d, prefix=""):
  """``{"a.b.c": value}`` of nested dicts; lists become tuples."""
  out = {}
  for k, v in (d.items() if hasattr(d, "items") else []):
    key = f"{prefix}{k}"
    if hasattr(v, "items"):
      out.update(_flat(v, key + "."))
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
    return _flat(dataclasses.asdict(ModelConfig.from_dict(block)), "model.")
  except (ValueError, TypeError, KeyError):
    return _flat(block, "model.")


def resume_config_differences(saved, config):
  """Compares a checkpoint's saved config with the config of a run resuming it.

  Args:
    saved: the checkpoint's config (a dict, as saved).
    config: the run's config (``ConfigDict`` or dict).

  Returns:
    ``(refused, logged)``: lists of ``(key, checkpoint value, config value)``. ``refused``: the
    ``model`` block (but :data:`_RUNTIME_MODEL_KEYS`), the data settings that shape parameters,
    the head-routing pool and EMA on/off (they shape the train state); ``logged``: the other
    ``optim``, ``data``, ``recipe``, ``seed``, ``train.num_steps`` and runtime model keys.
  """
  cur = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  a = {**_flat({k: v for k, v in saved.items() if k != "model"}), **_model_flat(saved.get("model", {}))}
  b = {**_flat({k: v for k, v in cur.items() if k != "model"}), **_model_flat(cur.get("model", {}))}
  refused, logged = [], []
  for key in sorted(set(a) | set(b)):
    va, vb = a.get(key, _ABSENT), b.get(key, _ABSENT)
    if va == vb:
      continue
    if (key.startswith("model.") and key not in _RUNTIME_MODEL_KEYS) or key in _SHAPE_KEYS:
      refused.append((key, va, vb))
    elif key == "recipe.head_windows.pool" and (a.get("recipe.head_windows.enabled") or b.get(
        "recipe.head_windows.enabled")):
      refused.append((key, va, vb))
    elif key == "optim.ema_decay" and va != _ABSENT and vb != _ABSENT and (va > 0) != (vb > 0):
      refused.append((key, va, vb))  # EMA on/off: the train state has (no) ema
    elif key in _RUNTIME_MODEL_KEYS or key.startswith(_LOGGED):
      logged.append((key, va, vb))
  return refused, logged


def _fmt(v):
  return repr(v) if isinstance(v, str) and v != _ABSENT else str(v)


def _check_resume_config(ckpt, step, config):
  """Refuses (:class:`ResumeConfigError`, one line naming every differing key) a resume of ``step``
  with another model; says each changed optimisation setting in one line."""
  try:
    saved = ckpt.restore_config(step)
  except Exception as e:  # pylint: disable=broad-except
    _say(f"note: checkpoint step {step} has no readable config ({type(e).__name__}); the model is not compared")
    return
  refused, logged = resume_config_differences(saved, config)
  if refused:
    diffs = "; ".join(f"{k}: {_fmt(va)} (checkpoint) != {_fmt(vb)}" for k, va, vb in refused)
    raise ResumeConfigError(
        f"cannot resume {ckpt.directory} step {step} with another model: {diffs}. Resume with the checkpoint's "
        "values, or train in a new --workdir (train.init_from=<this workdir> starts from its parameters)")
  for k, va, vb in logged:
    _say(f"config changed since checkpoint step {step}: {k}: {_fmt(va)} -> {_fmt(vb)}")


class _Writers:
  """Scalars to TensorBoard event files and a JSONL file (process 0 only), both rewound to ``start``:
  ``metrics.jsonl`` loses its lines of steps > ``start`` (and torn lines), TensorBoard purges events
  of steps > ``start`` (``purge_step``), so replayed steps are recorded once."""

  def __init__(self, workdir, start=0):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      _rewind_jsonl(workdir / "metrics.jsonl", start)
      purge = start + 1 if list((workdir / "tb").glob("events.out.tfevents.*")) else None
      self.tb = SummaryWriter(str(workdir / "tb"), purge_step=purge)
      self.jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")

  def write(self, step, scalars):
    if not self.active:
      return
    for k, v in scalars.items():
      self.tb.add_scalar(k, v, step)
    self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self.jsonl.flush()

  def close(self):
    if self.active:
      self.tb.close()
      self.jsonl.close()


def _rewind_jsonl(path, step):
  """Drops the lines of ``path`` with ``"step" > step`` (and unparsable ones: a write cut by a kill),
  rewriting it atomically; says how many."""
  if not path.exists():
    return
  lines = path.read_text(encoding="utf-8").splitlines()
  keep, torn = [], 0
  for line in lines:
    try:
      if json.loads(line)["step"] <= step:
        keep.append(line)
    except (ValueError, KeyError, TypeError):
      torn += 1
  if len(keep) == len(lines):
    return
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
  os.replace(tmp, path)
  _say(f"rewound {path} to step {step}: dropped {len(lines) - len(keep) - torn} line(s) of later steps"
       + (f" and {torn} unreadable line(s)" if torn else "") + " (training replays them)")


def write_sample(trainer, params, step, path):
  """Streams eval clip 0 (a rotation loop) from its first frame; writes ground truth | generated as a GIF."""
  from jaxwm.sampling.clips import eval_clip, stream_clip  # pylint: disable=g-import-not-at-top
  from jaxwm.utils.media import labelled, pose_captions, write_video  # pylint: disable=g-import-not-at-top
  clip = eval_clip(trainer.config, 0)
  frames = stream_clip(trainer.model, {"params": params}, trainer.config, clip, key=jax.random.key(step))
  write_video(path, labelled({"ground truth": clip["frames"], f"generated (step {step})": frames},
                             pose_captions(clip["c2w"]), scale=4), fps=4)


def _init_from(trainer, state, path):
  """Starts from the parameters of another run (the previous stage of a progressive recipe, ViewRope §3.4):
  fresh optimizer state and step, parameters (EMA if kept) of ``path``'s latest checkpoint, restored alone
  (params-only, :func:`jaxwm.sampling.load.restore_params`) into this run's parameter shardings."""
  from jaxwm.sampling.load import restore_params  # pylint: disable=g-import-not-at-top
  if _is_wan_weights(path):
    return _init_from_wan(trainer, state, path)
  target = ckpt_lib.abstract_with_shardings(trainer.abstract_state.params, trainer.state_shardings.params)
  try:
    params, src_step, _ = restore_params(path, target)
  except ValueError as e:
    raise RunRefusedError(f"train.init_from={path!r}: {e} (a stage may change encodings, sparsity or data, "
                     "not the parameter set)") from None
  except FileNotFoundError as e:  # none, or every step damaged
    raise RunRefusedError(f"train.init_from={path!r}: {' '.join(str(e).split())}") from None
  _say(f"initialised parameters from {path} (step {src_step})")
  ema = jax.tree_util.tree_map(jnp.copy, params) if state.ema else state.ema  # own buffers (donation)
  return state.replace(params=params, ema=ema)


def _is_wan_weights(path):
  """A ``.safetensors`` file, or a directory of them without jaxwm checkpoints: released Wan weights."""
  p = pathlib.Path(path)
  return (p.is_file() and p.suffix == ".safetensors") or (p.is_dir() and any(p.glob("*.safetensors")) and not (
      p / "checkpoints").exists())


def _init_from_wan(trainer, state, path):
  """Fine-tuning's start: the released Wan transformer's weights for every backbone parameter (straight into
  this run's shardings), this model's own initialisation for what it adds (camera path, memory)."""
  from jaxwm.convert.wan import pretrained_params  # pylint: disable=g-import-not-at-top
  try:
    params, loaded, kept = pretrained_params(path, trainer.model_cfg, state.params)
  except (KeyError, ValueError, FileNotFoundError) as e:
    raise RunRefusedError(f"train.init_from={path!r}: {' '.join(str(e).split())}") from None
  _say(f"initialised {len(loaded)} parameter arrays from the Wan weights at {path}; {len(kept)} added by this model "
       f"keep their initialisation" + (f" ({', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''})" if kept else ""))
  ema = jax.tree_util.tree_map(jnp.copy, params) if state.ema else state.ema
  return state.replace(params=params, ema=ema)


def run(config, workdir, mesh=None, progress=True):
  """Trains (or resumes) until ``config.train.num_steps``; returns ``(state, history)``.

  ``history`` lists the per-step losses of this call. The workdir is locked for the call
  (:class:`WorkdirLock`, process 0): a workdir locked by a live process raises
  :class:`WorkdirLockedError` before anything in it is touched. Resuming restores the newest
  intact checkpoint; a checkpoint of another model raises :class:`ResumeConfigError`, a
  checkpoints directory with no intact step :class:`RunRefusedError` (both one line, before any
  Orbax read of the state). Raises :class:`NonFiniteLossError` on a NaN/inf loss, before any
  checkpoint of that state. A refused run in a workdir it created removes that workdir again.
  """
  return run_locked(_run, config, workdir, mesh, progress)


def run_locked(body, config, workdir, mesh, progress):
  """``body(config, workdir, mesh, progress)`` in a locked workdir (jax.distributed first, when configured); a
  refused run (:class:`RunRefusedError`) removes a workdir it created. Shared by training and distillation."""
  maybe_initialize_distributed(config)
  workdir = pathlib.Path(workdir).absolute()
  fresh = not workdir.exists()
  workdir.mkdir(parents=True, exist_ok=True)
  lock = _lock_workdir(workdir)
  try:
    return body(config, workdir, mesh, progress)
  except RunRefusedError:
    if fresh and jax.process_index() == 0:
      lock.release()
      shutil.rmtree(workdir, ignore_errors=True)  # only this run wrote there: nothing is left behind
    raise
  finally:
    lock.release()


def _restore_or_init(trainer, ckpt, data_iter):
  """``(state, start)``: the newest intact checkpoint (its model checked against the config), or a
  fresh state (from ``train.init_from`` when set)."""
  config = trainer.config
  if not ckpt.all_steps():
    state = trainer.init_state()
    if config.train.get("init_from"):
      state = _init_from(trainer, state, config.train.init_from)
    return state, 0
  try:
    state, start = ckpt.restore(trainer.restore_target(), data_iter,
                                check=lambda step: _check_resume_config(ckpt, step, config))
  except ckpt_lib.DamagedCheckpointError as e:
    raise RunRefusedError(str(e)) from None
  _say(f"resumed from step {start} in {ckpt.directory}")
  return state, start


def _redo_missed_sample(trainer, params, start, workdir):
  """Writes the periodic sample of the restored step when the previous run stopped before writing it."""
  tc = trainer.config.train
  if not (start and tc.sample_every and jax.process_index() == 0):
    return
  if start % tc.sample_every == 0 or start == tc.num_steps:
    path = workdir / "samples" / f"step_{start:06d}.gif"
    if not path.exists():
      _say(f"writing {path}: the sample of step {start}, missed by the previous run")
      write_sample(trainer, params, start, path)


def _run(config, workdir, mesh, progress):
  trainer = Trainer(config, workdir, mesh)
  tc = config.train
  n_params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(trainer.abstract_state.params))
  _say(f"model: {n_params / 1e6:.2f}M parameters; mesh {dict(trainer.mesh.shape)}; "
       f"{trainer.tokens_per_step} tokens per step; workdir {workdir}")
  loader = trainer.make_loader()
  data_iter = iter(loader)
  ckpt = trainer.checkpointer()
  writers = bar = None
  try:
    state, start = _restore_or_init(trainer, ckpt, data_iter)
    _redo_missed_sample(trainer, state.params, start, workdir)
    base_key = jax.random.key(config.seed + 1)
    writers = _Writers(workdir, start)
    history = []
    bar = tqdm(total=tc.num_steps, initial=start, disable=not progress or jax.process_index() != 0,
               desc="train", dynamic_ncols=True)
    t_last, steps_since = time.perf_counter(), 0
    gain_every = tc.get("gain_every", 0)
    probes = [memory_gain.GainProbe(config, trainer.model),
              covisible_probe.CovisProbe(config, trainer.model)] if gain_every else []
    for step in range(start, tc.num_steps):
      batch = trainer.put_batch(next(data_iter))
      with jax.set_mesh(trainer.mesh):
        state, metrics = trainer.train_step(state, batch, base_key)
      loss = float(metrics["loss"])
      norms = {k: float(metrics[k]) for k in ("grad_norm", "param_norm")}
      if not (math.isfinite(loss) and all(map(math.isfinite, norms.values()))):
        raise NonFiniteLossError(
            f"non-finite training state at step {step + 1} (loss {loss}, gradient norm {norms['grad_norm']}, "
            f"parameter norm {norms['param_norm']}): training stopped and this state was not checkpointed "
            f"(latest checkpoint: step {ckpt.latest_step()}); lower config.optim.lr or check the data")
      history.append(loss)
      steps_since += 1
      bar.update(1)
      done = step + 1
      if done % tc.log_every == 0 or done == tc.num_steps:
        dt = time.perf_counter() - t_last
        rate = steps_since / max(dt, 1e-9)
        scalars = {"loss": loss, **norms, "lr": float(metrics["lr"]),
                   "steps_per_s": rate, "tokens_per_s": rate * trainer.tokens_per_step}
        if probes and (done % gain_every == 0 or done == tc.num_steps):
          with jax.set_mesh(trainer.mesh):
            for probe in probes:
              scalars.update(probe(state.params))
        writers.write(done, scalars)
        bar.set_postfix(loss=f"{loss:.4f}", steps_s=f"{rate:.2f}", tok_s=f"{scalars['tokens_per_s']:.0f}",
                        **({"gain_1": f"{scalars['gain_1']:.2f}"} if "gain_1" in scalars else {}),
                        **({"covis_1": f"{scalars['covis_tf_1']:.1f}"} if "covis_tf_1" in scalars else {}))
        t_last, steps_since = time.perf_counter(), 0
      if done % tc.ckpt_every == 0 or done == tc.num_steps:
        ckpt.save(done, state, data_iter, config)
      if tc.sample_every and (done % tc.sample_every == 0 or done == tc.num_steps) and jax.process_index() == 0:
        write_sample(trainer, state.params, done, workdir / "samples" / f"step_{done:06d}.gif")
  finally:
    if bar is not None:
      bar.close()
    if writers is not None:
      writers.close()
    ckpt.close()
  return state, history
